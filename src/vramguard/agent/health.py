"""The agent's health: its liveness and readiness as registries of named checks (`Checks`), and the health file
they are written to every second for the kubelet's exec probe (`base/healthfile.py` holds the format and the
probe's reading of it)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence

import structlog

from vramguard.base import healthfile
from vramguard.base.background import BackgroundLoop
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun

Check = Callable[[], healthfile.Check]
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Checks:
    """Named checks, registered by the parts they speak for as controller-runtime's healthz registers them
    (`AddReadyzCheck(name, checker)`), in stages: each check says whether it passes and why (what it found, where it
    passes: "" for nothing to say). A set of checks is a check itself; the server and the health file only ask it.

    A part built late (once NVML is up) is declared at the start with what its check says until then (`add`), and
    hands in its own checker once built (`supply`): the names and their order are the same from the first answer.
    Checks are added and supplied on one thread while others ask (a lock guards the list, never a check's call).

    Its answer (`checks()`: the health file's, and /healthz's and /readyz's) speaks of the first stage with a check
    failing, its failing checks' reasons joined: a later stage's failure is most often a consequence of an earlier
    one's (no scan completes while NVML is down), and the first reason is the one to act on. Where every check
    passes, what they found, or `passed` where none says anything. `listing()` is every check on a line of its own,
    as Kubernetes' own API server lists them on `/readyz?verbose` (`[+]ping ok`, `[-]informer-sync failed: why`),
    and a last line naming the set.
    """

    def __init__(self, name: str, stages: Sequence[Sequence[tuple[str, Check]]] = (), passed: str = "ok") -> None:
        self.name = name
        self.passed = passed
        self._lock = threading.Lock()
        self._stages: list[list[tuple[str, Check]]] = []
        for stage, checks in enumerate(stages):
            for check_name, check in checks:
                self.add(check_name, check, stage=stage)

    def add(self, name: str, check: Check, *, stage: int = 0) -> None:
        """Register `check` as `name`, after the checks of `stage` (0 is the first) registered before it. A name is
        registered once."""
        with self._lock:
            if any(name == known for checks in self._stages for known, _ in checks):
                raise ValueError(f"{self.name}: a check named {name!r} is registered already")
            while len(self._stages) <= stage:
                self._stages.append([])
            self._stages[stage].append((name, check))

    def supply(self, name: str, check: Check) -> None:
        """The part's own checker for `name`, in the place `add` gave it (which answered for it until now)."""
        with self._lock:
            for checks in self._stages:
                for i, (known, _) in enumerate(checks):
                    if known == name:
                        checks[i] = (name, check)
                        return
        raise KeyError(f"{self.name}: no check named {name!r} to supply")

    @property
    def stages(self) -> tuple[tuple[tuple[str, Check], ...], ...]:
        """The named checks by stage, as registered now."""
        with self._lock:
            return tuple(tuple(checks) for checks in self._stages)

    def names(self) -> tuple[str, ...]:
        """Every check's name, in the order the answer reads them."""
        return tuple(name for checks in self.stages for name, _ in checks)

    def __call__(self) -> healthfile.Check:
        found = [[(name, *check()) for name, check in stage] for stage in self.stages]
        for stage in found:
            failing = [why or f"{name} failed" for name, ok, why in stage if not ok]
            if failing:
                return False, "; ".join(failing)
        return True, "; ".join(why for stage in found for _, _, why in stage if why) or self.passed

    def listing(self) -> healthfile.Check:
        """Every check, passing or not, with why: (whether all pass, one line each and a last line for the set)."""
        lines: list[str] = []
        passes = True
        for stage in self.stages:
            for name, check in stage:
                ok, why = check()
                passes = passes and ok
                lines.append(f"[+]{name} ok" + (f": {why}" if why else "") if ok else f"[-]{name} failed: {why}")
        lines.append(f"{self.name} check {'passed' if passes else 'failed'}")
        return passes, "\n".join(lines)


def unless(problem: Callable[[], str | None]) -> Check:
    """A check that passes while `problem()` is None, and fails saying it otherwise."""

    def check() -> healthfile.Check:
        found = problem()
        return not found, found or ""

    return check


class HealthWriter:
    """Writes `live()` and `ready()` (each a `Checks` in the agent) to `path` at `start()` and every `interval_s`
    until `stop(deadline)`, then removes the file: an agent that stopped is not live.

    Its thread does nothing else, so the file's age is the probe's measure of this process making progress; what
    the checks say is the measure of the scan loop and the parts. A write that fails (the directory missing or
    read-only) is logged once per run of failures and retried each round: the probe then fails, visibly.
    """

    def __init__(
        self,
        path: str,
        live: Check,
        ready: Check,
        *,
        interval_s: float = healthfile.WRITE_EVERY_S,
        clock: Clock = SYSTEM_CLOCK,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.path = path
        self.live = live
        self.ready = ready
        self.interval_s = interval_s
        self.clock = clock  # CLOCK_MONOTONIC in the agent: the probe compares the file's time with its own
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.writes = 0  # for tests: how many documents were written
        self._failures = FailureRun()
        self.loop = BackgroundLoop("vramguard-health", self._step, clock=clock, on_exit=self._remove, log=self.log)

    def start(self) -> None:
        """Write the first document now (the probe may come at once), then every interval on a thread. The file's
        directory is made if missing (outside the chart's volume, on a machine of one's own)."""
        with contextlib.suppress(OSError):  # one it cannot make is reported by the write
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        self.write_once()
        self.loop.start()

    def stop(self, deadline: float) -> None:
        self.loop.stop(deadline)

    def _step(self) -> float:
        self.write_once()
        return self.interval_s

    def write_once(self) -> None:
        document = healthfile.HealthDocument(self.clock.now(), os.getpid(), self.live(), self.ready())
        try:
            write(self.path, document)
        except OSError as e:
            error = e.strerror or repr(e)
            if self._failures.failed(error):
                self.log.error("health_file_unwritable", file=self.path, error=error, probes="failing")
            return
        self.writes += 1
        if self._failures.ok():
            self.log.info("health_file_written", file=self.path)

    def _remove(self) -> None:
        with contextlib.suppress(OSError):  # never written, or removed by someone else: it says nothing now either way
            os.unlink(self.path)


def write(path: str, document: healthfile.HealthDocument) -> None:
    """Replace the file whole (a new file, then a rename): a reader sees the last document or the one before, never
    half of one. Raises OSError."""
    tmp = f"{path}.{os.getpid()}.tmp"  # a name of this process's own: no other writer's half file
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a write this process abandoned
    fd = os.open(tmp, _WRITE, 0o644)  # readable by the probe, which may run as another user; never a planted link
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(healthfile.encode(document))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
