"""Waiting between retries: exponential back-off with jitter (`Backoff`), and a rate bound (`TokenBucket`).

Jitter keeps a fleet polite: agents whose watches broke at the same instant do not all retry at the same instant
(client-go's `wait.Backoff` has a jitter factor for the same reason).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from vramguard.base.clock import SYSTEM_CLOCK, Clock


class Backoff:
    """Delays that start at `initial_s`, grow by `factor` per failure up to `max_s`, each stretched at random by
    up to `jitter` of itself (client-go's `wait.Backoff`): `next()` after a failure, `reset()` after a success.

    >>> b = Backoff(1.0, 60.0, jitter=0.0)
    >>> [b.next() for _ in range(4)]
    [1.0, 2.0, 4.0, 8.0]
    """

    def __init__(
        self,
        initial_s: float,
        max_s: float,
        *,
        factor: float = 2.0,
        jitter: float = 0.5,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if initial_s <= 0 or max_s < initial_s or factor < 1 or jitter < 0:
            raise ValueError(f"bad back-off: initial {initial_s}, max {max_s}, factor {factor}, jitter {jitter}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.factor = factor
        self.jitter = jitter
        self._rng = rng
        self._step_s = initial_s

    def next(self) -> float:
        """The delay before the next attempt; the one after it will be longer, up to `max_s` (before jitter)."""
        delay = self._step_s * (1.0 + self.jitter * self._rng())
        self._step_s = min(self._step_s * self.factor, self.max_s)
        return delay

    def reset(self) -> None:
        self._step_s = self.initial_s


class TokenBucket:
    """`burst` tokens, refilled at `per_minute` on `clock`: `take()` is False when empty; `wait()` blocks for a
    token (through `clock.wait`, so a test's clock passes the time)."""

    def __init__(self, burst: int, per_minute: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.burst = burst
        self.rate_per_s = per_minute / 60.0
        self.clock = clock
        self.tokens = float(burst)
        self.updated = clock.now()

    def _refill(self) -> None:
        t = self.clock.now()
        self.tokens = min(self.burst, self.tokens + (t - self.updated) * self.rate_per_s)
        self.updated = t

    def take(self) -> bool:
        self._refill()
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def wait(self, stop: threading.Event) -> bool:
        """Take a token, sleeping until one is due; False when `stop` is set first."""
        while not stop.is_set():
            if self.take():
                return True
            self.clock.wait(stop, (1 - self.tokens) / self.rate_per_s if self.rate_per_s > 0 else 1.0)
        return False
