"""Waiting between retries: exponential back-off with jitter, and a token bucket. One helper of each, used by
every retry loop and every rate bound in the agent.

Jitter is what keeps a fleet polite: after an API server restart, a thousand agents whose watches all broke at
the same instant would otherwise relist at the same instant, and again at each doubling. client-go's reflector
does the same (`wait.Backoff` with a jitter factor); so does this.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable


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
    """`burst` tokens, refilled at `per_minute`: `take()` is False when empty; `wait()` blocks for a token."""

    def __init__(self, burst: int, per_minute: float, now: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.rate_per_s = per_minute / 60.0
        self.now = now
        self.tokens = float(burst)
        self.updated = now()

    def _refill(self) -> None:
        t = self.now()
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
            stop.wait((1 - self.tokens) / self.rate_per_s if self.rate_per_s > 0 else 1.0)
        return False
