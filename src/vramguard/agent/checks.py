"""The named checks that make the agent dead (liveness) or unready (readiness), each the checker of the part it
speaks for, registered as controller-runtime registers them (`AddReadyzCheck(name, checker)`) into the two
`health.Checks` the health file and the HTTP server ask.

`AgentChecks` declares every name at the start, in the order the answers read them, with what each says before
its part exists: what exists only once NVML is up (the scan loop, the watch, the driver limits) hands in its own
checker when built (`AgentChecks.supply`). No check reaches through the agent to another part.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from vramguard.agent.health import Check, Checks, unless
from vramguard.agent.loop import Agent
from vramguard.agent.reload import InForce
from vramguard.base import healthfile
from vramguard.base.clock import Clock
from vramguard.base.heartbeat import Heartbeat
from vramguard.core.policy import DriverLimits
from vramguard.core.ports import PodSource

# A part whose thread has not gone round for this long is stuck (liveness fails): ten times the longest NVML call
# deadline, and far beyond any round a flood or a busy node makes (the HTTP server's rounds end within 0.1 s).
PART_STUCK_S = 30.0
NVML_STARTING = "NVML not initialised yet"


class LimiterState(Protocol):
    """What the driver-limits check asks of the limiter (`node.limiter.DriverLimiter`): its public word."""

    @property
    def unavailable(self) -> str | None: ...

    def unsupported_gpus(self) -> Mapping[int, str]: ...


def _passes() -> healthfile.Check:
    return True, ""


def _starting() -> healthfile.Check:
    return True, "starting"


def _not_scanned() -> healthfile.Check:
    return False, "no scan completed yet"


def server_rounds(rounds: Heartbeat, clock: Clock) -> Check:
    """The HTTP server's liveness: its thread went round (`rounds`, on `clock`) within `PART_STUCK_S`."""

    def check() -> healthfile.Check:
        age = rounds.age(clock.now())
        if age is not None and age >= PART_STUCK_S:
            return False, f"HTTP server's last round {age:.1f}s ago: stuck"
        return True, ""

    return check


def scan_loop(agent: Agent, poll_interval_s: float) -> Check:
    """The scan loop's liveness: a scan within `max(PART_STUCK_S, 10 polls)`, aged on the clock the scans read."""

    def check() -> healthfile.Check:
        if agent.last_scan_at is None:
            return True, "starting"
        age = agent.clock.now() - agent.last_scan_at
        if age >= max(PART_STUCK_S, 10 * poll_interval_s):
            return False, f"last scan {age:.1f}s ago: the scan loop is stuck"
        return True, f"last scan {age:.1f}s ago"

    return check


def scanned(agent: Agent) -> Check:
    """The scan loop's readiness: a scan completed with the pod list current (one before it attributed nothing)."""

    def check() -> healthfile.Check:
        if agent.last_scan_at is None:
            return False, "no scan completed yet"
        if agent.last_synced_scan_at is None:
            return False, "no scan with the pod list yet"
        return True, ""

    return check


class DriverLimitsCheck:
    """With `driver_limits: require` in the policy in force, whether the driver holds this node's quotas: the
    limiter's own word (`unavailable`, `unsupported_gpus()`), or why there is no limiter. It holds the policy in
    force, so it is registered with the reloader (`apply`) as every part that holds policy is."""

    def __init__(self, limiter: LimiterState | None, in_force: InForce) -> None:
        self.limiter = limiter  # None: none built (warn-only policy, --dry-run, driver_limits: off)
        self.in_force = in_force

    def apply(self, in_force: InForce) -> None:
        self.in_force = in_force

    def __call__(self) -> healthfile.Check:
        problem = self.problem()
        return not problem, problem or ""

    def problem(self) -> str | None:
        """Why the driver cannot hold the quotas the policy requires it to, or None."""
        in_force = self.in_force
        if in_force.policy.driver_limits is not DriverLimits.REQUIRE:
            return None
        limiter = self.limiter
        if limiter is None and "driver_limits" in in_force.restart_needed:
            return "driver limits required by the reloaded policy: they apply after a restart of the agent"
        if limiter is None:
            return "driver limits required, but never applied in warn mode or with --dry-run"
        if limiter.unavailable is not None:
            return f"driver limits required: {limiter.unavailable}"
        unsupported = limiter.unsupported_gpus()
        if unsupported:
            return "driver limits required: " + "; ".join(unsupported[g] for g in sorted(unsupported))
        return None


class AgentChecks:
    """Liveness (`healthz`) and readiness (`readyz`), every check named from the start.

    Live: the HTTP server's thread goes round (`http`), then the scan loop does (`scan-loop`). Ready: NVML is up
    (`nvml`, told by whoever opens it: `nvml`), the pod list is current (`pods`, the pod source's word), the driver
    holds the limits `driver_limits: require` asks for (`driver-limits`) and the watch between scans is not stuck
    (`memory-watch`); then a scan with the pod list completed (`scan`)."""

    def __init__(self, pods: PodSource, *, clock: Clock, http: Heartbeat | None = None) -> None:
        self.nvml_problem: str | None = NVML_STARTING
        self.healthz = Checks("healthz")
        self.healthz.add("http", server_rounds(http, clock) if http is not None else _passes)
        self.healthz.add("scan-loop", _starting, stage=1)
        self.readyz = Checks("readyz", passed="ready")
        self.readyz.add("nvml", unless(lambda: self.nvml_problem))
        self.readyz.add("pods", unless(pods.problem))
        self.readyz.add("driver-limits", _passes)
        self.readyz.add("memory-watch", _passes)
        self.readyz.add("scan", _not_scanned, stage=1)

    def nvml(self, problem: str | None) -> None:
        """Why NVML is not up, or None once it is (`open_sampler`'s word)."""
        self.nvml_problem = problem

    def supply(self, agent: Agent, poll_interval_s: float, limits: DriverLimitsCheck) -> None:
        """The checkers of the parts built once NVML is up: the scan loop's, the watch's (where there is one) and
        the driver limits'."""
        self.healthz.supply("scan-loop", scan_loop(agent, poll_interval_s))
        self.readyz.supply("driver-limits", limits)
        if agent.watch is not None:
            self.readyz.supply("memory-watch", unless(agent.watch_problem))
        self.readyz.supply("scan", scanned(agent))
