"""Calls made off the scan: a slow call (an API request) handed to a bounded worker, its answer taken by a later scan.

`OffScanCalls.submit` hands a call to the runner and returns its ticket at once (None when the runner's queue is
full or it is stopping); `collect(now)` never waits: it returns how each call ended since the last collect. A call
unanswered `timeout_s` after it was submitted is given up: it is counted, no longer waited for, and its slot is
free for the next call; if the worker has not begun it yet (it is queued behind a call stuck on a frozen API
server), it is never made. One given up after it was made still ends: its answer comes back marked late, and until
then `unfinished(key)` says so, so that a caller sends no second call that the worker would make behind it.

The answers cross from the worker's thread through one queue; every other field is the scan's alone.
"""

from __future__ import annotations

import enum
import itertools
import queue
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from vramguard.base.worker import Runner

A = TypeVar("A")  # what a call is about, for its caller (an eviction's action)
R = TypeVar("R")  # what a call answers


class Fate(str, enum.Enum):
    """How a call ended, as `collect` reports it: each call ends once, and once more as LATE or NOT_MADE when it
    was given up."""

    ANSWERED = "answered"  # answered in time: `Ending.value`, or `Ending.error` when the call raised
    GIVEN_UP = "given-up"  # unanswered `timeout_s` after it was submitted: no longer waited for
    LATE = "late"  # the answer of a call given up on, after all
    NOT_MADE = "not-made"  # a call given up on before the worker began it: never made


@dataclass(frozen=True, slots=True)
class Call(Generic[A]):
    """One call submitted: its ticket (which tells its answer from that of an earlier call of the same key), the
    key it is counted under, what it is about and when it was submitted, on the caller's clock."""

    ticket: int
    key: Hashable
    about: A
    submitted_at: float


@dataclass(frozen=True, slots=True)
class Ending(Generic[A, R]):
    """What became of a call: ANSWERED and LATE carry its value, or the exception it raised."""

    call: Call[A]
    fate: Fate
    value: R | None = None
    error: Exception | None = None


@dataclass(slots=True)
class _Entry(Generic[A]):
    call: Call[A]
    given_up: threading.Event  # set by the scan: the worker does not make a call it has not begun


class OffScanCalls(Generic[A, R]):
    """Calls on one runner (`start()`, `stop(deadline)`), each waited for `timeout_s` at most: a number, or a
    function read at each `collect` (a reloaded policy's timeout applies to the calls already in flight)."""

    def __init__(self, runner: Runner, timeout_s: float | Callable[[], float]) -> None:
        self.runner = runner
        self._timeout_s = timeout_s
        self.given_up = 0  # calls given up on, since the start
        self._waiting: dict[int, _Entry[A]] = {}  # by ticket, in the order submitted
        self._unfinished: dict[int, _Entry[A]] = {}  # given up on, their task not yet ended
        self._answers: queue.SimpleQueue[tuple[int, Fate, R | None, Exception | None]] = queue.SimpleQueue()
        self._tickets = itertools.count(1)

    def start(self) -> None:
        self.runner.start()

    def stop(self, deadline: float) -> None:
        """Stop the runner; a call in flight at `deadline` is abandoned there (its request has a timeout)."""
        self.runner.stop(deadline)

    @property
    def timeout_s(self) -> float:
        return self._timeout_s() if callable(self._timeout_s) else self._timeout_s

    def submit(self, key: Hashable, about: A, call: Callable[[], R], now: float) -> Call[A] | None:
        """Hand `call` to the runner; its ticket, or None (and nothing submitted) when the runner refuses it."""
        entry = _Entry(Call(next(self._tickets), key, about, now), threading.Event())
        ticket, given_up, answers = entry.call.ticket, entry.given_up, self._answers

        def task() -> None:
            if given_up.is_set():  # nobody waits for it any more: a call not yet made is not made
                answers.put((ticket, Fate.NOT_MADE, None, None))
                return
            try:
                answers.put((ticket, Fate.ANSWERED, call(), None))
            except Exception as e:  # the call's failure is its answer; the scan hears of it
                answers.put((ticket, Fate.ANSWERED, None, e))

        self._waiting[ticket] = entry  # before the submit: a runner may run the task at once (`Inline`)
        if not self.runner.submit(task):
            del self._waiting[ticket]
            return None
        return entry.call

    def waiting(self, key: Hashable | None = None) -> int:
        """How many calls (of `key`, or all) are waited for: submitted, neither answered nor given up."""
        return sum(1 for e in self._waiting.values() if key is None or e.call.key == key)

    def unfinished(self, key: Hashable) -> bool:
        """Whether a call of `key` was given up on and its task has not ended: the worker may still make it."""
        return any(e.call.key == key for e in self._unfinished.values())

    def collect(self, now: float) -> list[Ending[A, R]]:
        """How calls ended since the last collect: the answers in the order they came (a given-up call's as LATE
        or NOT_MADE), then the calls given up now, unanswered `timeout_s` after they were submitted."""
        endings: list[Ending[A, R]] = []
        while True:
            try:
                ticket, fate, value, error = self._answers.get_nowait()
            except queue.Empty:
                break
            if (entry := self._waiting.pop(ticket, None)) is not None:
                endings.append(Ending(entry.call, fate, value, error))
            elif (entry := self._unfinished.pop(ticket, None)) is not None:
                endings.append(Ending(entry.call, Fate.LATE if fate is Fate.ANSWERED else fate, value, error))
        timeout_s = self.timeout_s
        for ticket, entry in list(self._waiting.items()):
            if now - entry.call.submitted_at >= timeout_s:
                del self._waiting[ticket]
                entry.given_up.set()
                self._unfinished[ticket] = entry
                self.given_up += 1
                endings.append(Ending(entry.call, Fate.GIVEN_UP))
        return endings
