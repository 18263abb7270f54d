"""Carrying out decided actions through the seams: events, eviction, killing. Dry-run turns each into a report.

The Enforcer never decides: it does what an `Action` says, in the way the policy says (`on_eviction_refused`),
and reports a result for each. A failing seam (the API server is down, the process is gone) is a result, not an
exception: the loop goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from vramguard.model import Action, EvictionRefused, Mode, Policy
from vramguard.ports import EventRecorder, Evictor, Killer, KillResult

# Event reasons, as they appear on the pod (`kubectl describe pod`).
EVENT_EXCEEDED = "VRAMQuotaExceeded"
EVENT_EVICTED = "VRAMEvicted"
EVENT_KILLED = "VRAMKilled"
EVENT_INVALID = "VRAMQuotaInvalid"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one action. `result` is the `result` label of vramguard_actions_total."""

    action: Action
    result: str  # ok | dry-run | failed | refused | refused-then-killed | nothing-to-kill
    detail: str = ""
    kill: KillResult | None = None

    @property
    def action_name(self) -> str:
        return self.action.kind.value


class Enforcer:
    def __init__(
        self,
        *,
        killer: Killer,
        evictor: Evictor,
        events: EventRecorder,
        policy: Policy,
        dry_run: bool = False,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.killer = killer
        self.evictor = evictor
        self.events = events
        self.policy = policy
        self.dry_run = dry_run
        self.log = log if log is not None else structlog.get_logger("vramguard.act")

    def execute(self, action: Action) -> Outcome:
        if self.dry_run:
            return Outcome(action, "dry-run", f"would {action.kind.value}: {action.message}")
        try:
            if action.kind is Mode.WARN:
                self._event(action, EVENT_EXCEEDED, action.message)
                return Outcome(action, "ok")
            if action.kind is Mode.EVICT:
                return self._evict(action)
            return self._kill(action, refused_first=False)
        except Exception as e:  # a seam failed: report it and keep the loop alive
            self.log.error("action_failed", action=action.kind.value, pod=action.pod.key, error=repr(e))
            return Outcome(action, "failed", repr(e))

    def _evict(self, action: Action) -> Outcome:
        result = self.evictor.evict(action.pod, action.message)
        if result.evicted:
            self._event(action, EVENT_EVICTED, f"evicted: {action.message}")
            return Outcome(action, "ok", result.message)
        if result.refused and self.policy.on_eviction_refused is EvictionRefused.KILL:
            return self._kill(action, refused_first=True)
        return Outcome(action, "refused" if result.refused else "failed", result.message)

    def _kill(self, action: Action, *, refused_first: bool) -> Outcome:
        kill = self.killer.kill(action.violation)
        if not kill.killed:
            why = "; ".join(f"{ref.pid}: {reason}" for ref, reason in kill.skipped) or "no GPU process found"
            return Outcome(action, "nothing-to-kill", why, kill)
        pids = ", ".join(str(ref.pid) for ref in kill.killed)
        prefix = "eviction refused by a PodDisruptionBudget, " if refused_first else ""
        self._event(action, EVENT_KILLED, f"{prefix}killed PIDs {pids}: {action.message}")
        result = "refused-then-killed" if refused_first else ("ok" if kill.exited else "failed")
        return Outcome(action, result, "" if kill.exited else "processes did not exit before the deadline", kill)

    def _event(self, action: Action, reason: str, message: str) -> None:
        try:
            self.events.record(action.pod, reason, message)
        except Exception as e:  # an Event is a report; failing to write it must not undo the action
            self.log.warning("event_failed", pod=action.pod.key, reason=reason, error=repr(e))
