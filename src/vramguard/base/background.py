"""The one background loop: a thread that runs a step until stopped (client-go's `wait.Until` / `BackoffUntil`).

Every part with a thread of its own runs on a `BackgroundLoop`, so the thread, the stop, the pacing, the retry
after a crash and the join against the shutdown deadline are written once. A part supplies what only it knows:
one round of its work (`step`), how to interrupt a step blocked on its own I/O (`wake`), and what its thread owned
that must be released once the thread has ended (`on_exit`). The only other thread in the agent is the NVML call
that may hang in the driver (`nvml/deadline.py`): that one is abandoned, never joined.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun

Step = Callable[[], float]
"""One round of work; returns the seconds to wait before the next round (0: at once). A step may block on its own
bounded I/O (a select, a queue, a stream read) as long as `wake` can end that wait."""


def _nothing() -> None:
    pass


class BackgroundLoop:
    """`start()` runs `step` on a daemon thread until `stop(deadline)`: between rounds it waits what the step
    asked for on the clock, ended early by the stop. A step that raises is logged (once per run of the same
    error) and retried after `backoff`, never in a busy loop. `on_exit` runs on the thread after its last round;
    a thread still busy at the deadline is abandoned (a daemon), and it runs `on_exit` itself when it ends."""

    def __init__(
        self,
        name: str,
        step: Step,
        *,
        clock: Clock = SYSTEM_CLOCK,
        wake: Callable[[], None] = _nothing,
        on_exit: Callable[[], None] = _nothing,
        backoff: Backoff | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        self.stopping = threading.Event()  # a step that loops inside itself looks at it
        self._step = step
        self._wake = wake
        self._on_exit = on_exit
        self._backoff = backoff if backoff is not None else Backoff(0.1, 5.0)
        self._log = log if log is not None else structlog.get_logger(__name__)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"the {self.name} loop was started twice")
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, deadline: float) -> bool:
        """Stop after the current round, waiting for it until `deadline` (on the clock's `now()` scale); True when
        the thread has ended (or never started)."""
        self.stopping.set()
        self._wake()
        thread = self._thread
        if thread is None or thread.ident is None:
            return True
        thread.join(max(0.0, deadline - self.clock.now()))
        return not thread.is_alive()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """The loop itself, on the calling thread: the thread's body, and how a unit test runs rounds without one
        (a `FakeClock` whose `on_wait` sets `stopping` after the rounds it wants)."""
        failures = FailureRun()
        try:
            while not self.stopping.is_set():
                try:
                    wait_s = self._step()
                except Exception as e:
                    if failures.failed(repr(e)):
                        self._log.exception("loop_step_failed", loop=self.name, error=repr(e))
                    wait_s = self._backoff.next()
                else:
                    if failures.ok():
                        self._log.info("loop_step_recovered", loop=self.name)
                        self._backoff.reset()
                if wait_s > 0 and not self.stopping.is_set():
                    self.clock.wait(self.stopping, wait_s)
        finally:
            self._on_exit()
