"""Fresh reads of the API server for the orphan tracker (`core/orphans.py`), off the scan.

An orphan is confirmed only by a read of this node's pods made after its grace passed (`PodLister.present`: a
consistent LIST, one request). The read is a network call, so it is made off the scan (`base/offscan.py`, on a
worker of its own): `request(now)` when a scan wants one, `collect(now)` at each scan for the answer. At most one is
in flight, and one starts at most every `READ_SPACING_S`; a failed or unanswered read backs off up to
`MAX_READ_BACKOFF_S`. Only a node with pods absent past their grace reads at all: what that costs a fleet is in
docs/scale.md.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import structlog

from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.base.offscan import Fate, OffScanCalls
from vramguard.base.worker import Runner, Worker
from vramguard.core.orphans import PodRead
from vramguard.core.ports import PodLister
from vramguard.core.text import cut

# A read starts at most this often: a pod absent past its grace and present in the read (a cache behind the API
# server) is read about again after another grace, and several such pods share one read.
READ_SPACING_S = 30.0
# A read unanswered this long is given up (its request has a timeout of its own: a stuck worker is the only way);
# one given up on before the worker began it is never made, and the answer of one made is not trusted to be fresh.
READ_TIMEOUT_S = 60.0
MAX_READ_BACKOFF_S = 600.0


class OrphanReads:
    """One read of the API server in flight at most, on its own worker (`start()`, `stop(deadline)`)."""

    def __init__(
        self,
        lister: PodLister,
        *,
        clock: Clock = SYSTEM_CLOCK,
        runner: Runner | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.lister = lister
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger(__name__)
        worker = runner if runner is not None else Worker("vramguard-orphan-reads", max_queue=1, clock=clock)
        self.reads = 0  # reads started, for tests and logs
        self._calls: OffScanCalls[None, frozenset[str]] = OffScanCalls(worker, READ_TIMEOUT_S)
        self._next_at: float | None = None  # no read before this
        self._backoff = Backoff(READ_SPACING_S, MAX_READ_BACKOFF_S, rng=rng)
        self._failures = FailureRun()

    def start(self) -> None:
        self._calls.start()

    def stop(self, deadline: float) -> None:
        self._calls.stop(deadline)

    def request(self, now: float) -> bool:
        """Start a read, unless one is in flight or the spacing (or back-off) holds it; True when one started."""
        if self._calls.waiting() or (self._next_at is not None and now < self._next_at):
            return False
        if self._calls.submit("read", None, self.lister.present, now) is None:
            return False
        self.reads += 1
        self._next_at = now + READ_SPACING_S
        return True

    def collect(self, now: float) -> PodRead | None:
        """The answer of the read in flight, once it came; None before, or when it failed."""
        found: PodRead | None = None
        for end in self._calls.collect(now):
            if end.fate is Fate.GIVEN_UP:
                self._failed(f"no answer in {READ_TIMEOUT_S:g}s", now)
            elif end.fate is not Fate.ANSWERED:
                continue  # the answer of a read given up on: late, so it is not trusted to be fresh
            elif end.value is None:  # a failed read confirms nothing
                self._failed(f"{type(end.error).__name__}: {cut(str(end.error), 300)}", now)
            else:
                if self._failures.ok():
                    self.log.info("orphan_read_restored")
                self._backoff.reset()
                found = PodRead(end.call.submitted_at, end.value)
        return found

    def _failed(self, error: str, now: float) -> None:
        delay = self._backoff.next()
        self._next_at = now + delay
        if not self._failures.failing:
            self.log.warning("orphan_read_failed", error=error, retry_in_s=round(delay, 1))
        self._failures.failed(error)
