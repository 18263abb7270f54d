"""The shared lifecycle pieces: parts stopped in reverse within one budget, and logging once per run of failures."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from structlog.testing import capture_logs

from vramguard.base.lifecycle import Services
from vramguard.base.logs import FailureRun
from vramguard_testbed.fakes import FakeClock


@dataclass
class Part:
    name: str
    journal: list[str]
    clock: FakeClock
    takes_s: float = 0.0
    fails: bool = False
    deadlines: list[float] = field(default_factory=list)

    def start(self) -> None:
        self.journal.append(f"start {self.name}")

    def stop(self, deadline: float) -> None:
        self.journal.append(f"stop {self.name}")
        self.deadlines.append(deadline)
        self.clock.step(self.takes_s)
        if self.fails:
            raise RuntimeError("stuck")


def test_parts_start_in_order_and_stop_in_reverse_by_one_deadline() -> None:
    """Parts stop in reverse of their start by one shared deadline, past a failing stop, and only once."""
    clock, journal = FakeClock(), list[str]()
    services = Services(clock)
    first = services.start("first", Part("first", journal, clock, takes_s=0.2))
    second = services.start("second", Part("second", journal, clock, takes_s=0.3, fails=True))
    with capture_logs() as logs:
        services.stop(1.0)
    assert journal == ["start first", "start second", "stop second", "stop first"]
    assert [(e["event"], e["part"]) for e in logs] == [("stop_failed", "second")]
    assert first.deadlines == second.deadlines == [1001.0]  # one deadline for all, not a slice each
    services.stop(1.0)  # already stopped: nothing twice
    assert journal.count("stop first") == 1


def test_failure_run_logs_the_first_failure_a_changed_error_and_the_recovery() -> None:
    """FailureRun says to log the first failure of a run, a changed error and the recovery, and nothing else."""
    run = FailureRun()
    assert not run.ok()  # no run to end
    assert [run.failed("timeout"), run.failed("timeout"), run.failing] == [True, False, True]
    assert run.failed("refused")
    assert run.ok() and not run.failing
    assert run.failed("timeout")  # a new run


def test_fake_clock_wait_passes_the_time_unless_stopped() -> None:
    """FakeClock.wait passes the whole timeout unless its event is set, and then passes no time."""
    clock, stop = FakeClock(), threading.Event()
    assert not clock.wait(stop, 5.0) and clock.now() == 1005.0
    stop.set()
    assert clock.wait(stop, 5.0) and clock.now() == 1005.0
