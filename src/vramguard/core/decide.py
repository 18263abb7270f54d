"""The decision core: which subjects violate their quota, for how long, and what to do about it.

Pure functions only, in the manner of the kubelet's eviction `helpers.go`: `now` is an argument, the previous
`DecisionState` comes in and the next one goes out, and nothing here reads a clock, logs or touches a process.
Its words (subject, violation, episode, pressure, repeat, who goes first): `docs/architecture.md` "The decision core's
vocabulary".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TypeVar

from vramguard.core.actions import Action, Escalation, KillRecord, PressureNotice, Reason, Violation
from vramguard.core.policy import ActionKind, Mode, OnRepeat, Policy
from vramguard.core.process import ProcessRef
from vramguard.core.quantity import format_duration
from vramguard.core.quota import PodQuota, Quota, QuotaRow, QuotaScope, Subject, row_quota
from vramguard.core.sample import GpuDevice
from vramguard.core.snapshot import ContainerUsage, Snapshot


@dataclass(frozen=True, slots=True)
class Episode:
    first_observed_at: float  # when usage first went above the limit
    hard_since: float | None  # when usage went above the hard limit, if it is above it now
    warned: bool = False


@dataclass(frozen=True, slots=True)
class DecisionState:
    """Everything `decide` remembers between scans."""

    episodes: Mapping[Subject, Episode] = field(default_factory=lambda: MappingProxyType({}))
    # When each target was last acted on, what the cooldown spaces: a container instance (runtime ID) for a kill, a
    # pod (UID) for an eviction or a kill of processes in no container. The two kinds of key cannot collide.
    last_action_at: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # The GPUs under pressure (device UUID), each with the last time its free memory was below the threshold.
    pressure: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Container instances (runtime IDs) the agent killed in, each with its last kill there: a violation there within
    # the repeat window, by a process that started after that kill, is a repeat.
    kills: Mapping[str, KillRecord] = field(default_factory=lambda: MappingProxyType({}))
    # Pods whose eviction the API server accepted (by UID), each with when: not evicted again until seen
    # terminating or gone, or until eviction_timeout_s has passed.
    evicted: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


def record_outcomes(
    state: DecisionState,
    now: float,
    *,
    killed_in: Iterable[tuple[str, Iterable[ProcessRef]]] = (),
    evicted: Iterable[str] = (),
) -> DecisionState:
    """`state` knowing what the enforcer just did, as its outcomes say: which processes it killed in which container
    instances (each instance's record becomes this kill's, with every process it killed there), and which pods'
    evictions the API server accepted (by UID). Unchanged when it did neither."""
    killed: dict[str, set[ProcessRef]] = {}
    for container_id, refs in killed_in:
        killed.setdefault(container_id, set()).update(refs)
    uids = tuple(evicted)
    if not killed and not uids:
        return state
    records = {c: KillRecord(at=now, killed=tuple(sorted(refs))) for c, refs in killed.items()}
    return replace(
        state,
        kills=MappingProxyType({**state.kills, **records}) if records else state.kills,
        evicted=MappingProxyType({**state.evicted, **dict.fromkeys(uids, now)}) if uids else state.evicted,
    )


@dataclass(frozen=True, slots=True)
class Held:
    """An enforcement that was due but not taken, and why (for logs and `vramguard top`)."""

    violation: Violation
    reason: Reason
    why: str


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...]
    violations: tuple[Violation, ...]
    held: tuple[Held, ...] = ()
    rows: tuple[QuotaRow, ...] = ()  # the snapshot's rows, in its order, each with its subject and quota (`quota_rows`)
    pressured_devices: tuple[str, ...] = ()  # UUIDs of the devices under memory pressure
    notices: tuple[PressureNotice, ...] = ()  # for the pods on each GPU that entered pressure this scan


# --------------------------------------------------------------------------------------------------------------
# Step 1: subjects and violations


def quota_rows(snapshot: Snapshot, quotas: Mapping[str, PodQuota]) -> tuple[QuotaRow, ...]:
    """Each row of the snapshot, in its order, with the quota that governs it (`quota.row_quota`): a container with its
    own quota is a subject alone; the rows a pod-wide quota covers on a GPU are one subject, and so are the rows of the
    pod's containers holding one DRA share. A row of a pod without a quota there is unmanaged (None). The agent hands
    `decide` these from its `QuotaBook.rows`, which works each out once while the pod's quota is unchanged."""
    rows: list[QuotaRow] = []
    for usage in snapshot.containers:
        uid = usage.pod.uid
        pod_quota = quotas.get(uid)
        governing = None if pod_quota is None else row_quota(uid, pod_quota, usage.container, usage.device_uuid)
        rows.append((usage, governing))
    return tuple(rows)


def find_violations(snapshot: Snapshot, rows: Iterable[QuotaRow]) -> tuple[Violation, ...]:
    """Every subject above its limit on a healthy device, in a deterministic order.

    A container with its own quota is checked alone, on each GPU against its quota there (a DRA share is per
    GPU); the rows of a subject of several containers (a pod-wide quota, a DRA share) are summed first. Unmanaged
    rows never violate.
    """
    # Subjects of several containers accumulate before they can be judged.
    together: dict[Subject, tuple[Quota, list[ContainerUsage]]] = {}
    violations: list[Violation] = []
    for usage, governing in rows:
        if governing is None:
            continue
        subject, quota = governing.subject, governing.quota
        if subject.scope is QuotaScope.CONTAINER:
            # Most rows are within quota: rule them out before building anything (this loop runs per row).
            device = snapshot.device(usage.device_uuid)
            if device is None or usage.used_bytes <= quota.limit_for(device.total_bytes):
                continue
            v = _judge(snapshot, [usage], quota, subject, usage.container)
            if v is not None:
                violations.append(v)
        else:
            together.setdefault(subject, (quota, []))[1].append(usage)
    for subject, (quota, usages) in together.items():
        shown = ", ".join(sorted({u.container for u in usages})) if subject.scope is QuotaScope.SHARE else None
        v = _judge(snapshot, usages, quota, subject, shown)
        if v is not None:
            violations.append(v)
    return tuple(sorted(violations, key=lambda v: (v.pod.namespace, v.pod.name, v.container or "", v.device.uuid)))


def _judge(
    snapshot: Snapshot, usages: list[ContainerUsage], quota: Quota, subject: Subject, container: str | None
) -> Violation | None:
    device = snapshot.device(usages[0].device_uuid)
    if device is None or not device.healthy:
        return None
    used = sum(u.used_bytes for u in usages)
    limit = quota.limit_for(device.total_bytes)
    if used <= limit:
        return None
    return Violation(
        pod=usages[0].pod,
        container=container,
        device=device,
        used_bytes=used,
        limit_bytes=limit,
        hard_bytes=quota.hard_for(device.total_bytes),
        quota_source=quota.source,
        processes=tuple(sorted({p for u in usages for p in u.processes})),
        container_ids=tuple(sorted({u.container_id for u in usages if u.container_id})),
        key=subject,
    )


# --------------------------------------------------------------------------------------------------------------
# Step 2: episodes (first observed, hard since, warned)


def track_episodes(
    violations: Iterable[Violation], previous: Mapping[Subject, Episode], now: float
) -> dict[Subject, Episode]:
    """Carry each ongoing episode forward; start new ones; drop the ones whose subject is back under its limit."""
    episodes: dict[Subject, Episode] = {}
    for v in violations:
        prev = previous.get(v.key)
        if prev is None:
            episodes[v.key] = Episode(first_observed_at=now, hard_since=now if v.hard else None)
        else:
            hard_since = (prev.hard_since if prev.hard_since is not None else now) if v.hard else None
            episodes[v.key] = replace(prev, hard_since=hard_since)
    return episodes


# --------------------------------------------------------------------------------------------------------------
# Step 3: what is due, ranked


def came_back(processes: Iterable[ProcessRef], kill: KillRecord) -> bool:
    """Whether GPU processes came back after `kill`: one of `processes` started after every process it killed.

    Both start times are clock ticks since boot, as /proc gives them, so no clock is mixed. A kill that names no
    process is no evidence; a process still there from before the kill (one it missed, one it never reached) or
    started in the same tick as the newest killed one did not come back."""
    if not kill.killed:
        return False
    newest = max(r.start_time for r in kill.killed)
    return any(p.start_time > newest for p in processes)


def repeat_of(v: Violation, policy: Policy, kills: Mapping[str, KillRecord], now: float) -> Escalation | None:
    """The escalation a violation gets when it is a repeat and the policy escalates repeats in its namespace; None
    otherwise. A repeat: one of its container instances was killed in within the repeat window (whatever the
    cooldown), and one of its processes started after that kill (`came_back`)."""
    step = policy.on_repeat_for(v.pod.namespace)
    if step is OnRepeat.WAIT:
        return None
    records = [
        r
        for c in v.container_ids
        if (r := kills.get(c)) is not None and now - r.at < policy.repeat_window_s and came_back(v.processes, r)
    ]
    if not records:
        return None
    last = max(records, key=lambda r: r.at)
    return Escalation(step=step, since_kill_s=now - last.at, restored=last.restored)


def due_reason(v: Violation, episode: Episode, policy: Policy, now: float, repeat: bool = False) -> Reason | None:
    """HARD_LIMIT once above the hard limit for hard_grace (at once for a repeat: it had its grace before the
    kill); SOFT_LIMIT once above the soft one for soft_grace."""
    if episode.hard_since is not None and (repeat or now - episode.hard_since >= policy.hard_grace_s):
        return Reason.HARD_LIMIT
    if not v.hard and now - episode.first_observed_at >= policy.soft_grace_s:
        return Reason.SOFT_LIMIT
    return None


Comparator = Callable[[Violation, Violation], int]
"""Negative when the first violation goes before the second, positive when after, 0 when this one cannot tell."""


_Key = TypeVar("_Key", int, str)


def _compare(a: _Key, b: _Key) -> int:
    return (a > b) - (a < b)


def by_overage(a: Violation, b: Violation) -> int:
    """The one further over its limit first (the kubelet's exceedMemoryRequests)."""
    return _compare(b.overage_bytes, a.overage_bytes)


def by_priority(a: Violation, b: Violation) -> int:
    """The pod of lower priority first."""
    return _compare(a.pod.priority, b.pod.priority)


def by_usage(a: Violation, b: Violation) -> int:
    """The one using more GPU memory first."""
    return _compare(b.used_bytes, a.used_bytes)


def by_uid(a: Violation, b: Violation) -> int:
    """Pod UID order: the same inputs always rank the same way."""
    return _compare(a.pod.uid, b.pod.uid)


def ordered_by(*comparators: Comparator) -> Comparator:
    """The first comparator that tells the two apart decides (the kubelet's `orderedBy`)."""

    def compare(a: Violation, b: Violation) -> int:
        for comparator in comparators:
            result = comparator(a, b)
            if result:
                return result
        return 0

    return compare


VICTIM_ORDER: Comparator = ordered_by(by_overage, by_priority, by_usage, by_uid)


def rank(violations: Iterable[Violation], order: Comparator = VICTIM_ORDER) -> list[Violation]:
    """Violations, who goes first first (stable: ties keep their order)."""
    return sorted(violations, key=functools.cmp_to_key(order))


def track_pressure(
    devices: Iterable[GpuDevice], policy: Policy, previous: Mapping[str, float], now: float
) -> dict[str, float]:
    """The GPUs under pressure now, each with the last time its free memory was below the threshold.

    A healthy GPU enters pressure the scan its free memory is below the threshold, and leaves it once it has been
    at or above the threshold for `policy.pressure_transition_s`; a dip below restarts that wait. A GPU that is
    unhealthy or gone is not under pressure (nothing is acted on there anyway).
    """
    pressure: dict[str, float] = {}
    for d in devices:
        if not d.healthy:
            continue
        if policy.under_pressure(d):
            pressure[d.uuid] = now
        elif d.uuid in previous and now - previous[d.uuid] < policy.pressure_transition_s:
            pressure[d.uuid] = previous[d.uuid]
    return pressure


def pressure_notices(
    snapshot: Snapshot,
    rows: Iterable[QuotaRow],
    violations: Iterable[Violation],
    entered: Iterable[str],
) -> tuple[PressureNotice, ...]:
    """For each GPU in `entered` (UUIDs of GPUs that entered pressure), one notice to every pod with a process
    there, the over-quota ones included (they are told what they hold) and exempt ones too (a notice disrupts
    nothing), never the agent's own pod. The notice names the subjects over their quota there, furthest over
    first; when none is, where the memory is."""
    entered = set(entered)
    if not entered:
        return ()
    over: dict[str, list[Violation]] = {}
    for v in violations:
        if v.device.uuid in entered:
            over.setdefault(v.device.uuid, []).append(v)
    on: dict[str, list[QuotaRow]] = {}
    for usage, governing in rows:
        if usage.device_uuid in entered:
            on.setdefault(usage.device_uuid, []).append((usage, governing))
    notices: list[PressureNotice] = []
    for device in snapshot.devices:
        if device.uuid not in entered:
            continue
        there = on.get(device.uuid, [])
        within = sum(u.used_bytes for u, governing in there if governing is not None)
        unmanaged = sum(u.used_bytes for u, governing in there if governing is None)
        offenders = tuple(sorted(over.get(device.uuid, ()), key=lambda v: -v.overage_bytes))
        if offenders:
            within = unmanaged = outside = 0  # the message names the offenders instead
        else:
            outside = sum(p.used_bytes for p in snapshot.unattributed if p.device_uuid == device.uuid)
        recipients = {u.pod.uid: u.pod for u, _ in there if u.pod.uid != snapshot.agent_pod_uid}
        for recipient in sorted(recipients.values(), key=lambda p: (p.namespace, p.name, p.uid)):
            notices.append(
                PressureNotice(
                    pod=recipient,
                    device=device,
                    offenders=offenders,
                    within_quota_bytes=within,
                    unmanaged_bytes=unmanaged,
                    outside_pods_bytes=outside,
                )
            )
    return tuple(notices)


def hold_reason(v: Violation, reason: Reason, policy: Policy, snapshot: Snapshot) -> str | None:
    """Why an enforcement that is due for `reason` must not happen (blast radius), or None when it may; what an
    earlier action holds is `spacing_hold`'s.

    A terminating pod is held unless it is over its hard limit: deleting one's own pod with a long grace period
    must not buy time above the quota, but a pod that is going away anyway is not worth acting on for a soft
    limit or for pressure.
    """
    pod = v.pod
    if (exempt := policy.exemption(pod.uid, pod.namespace, snapshot.agent_pod_uid)) is not None:
        return exempt
    if snapshot.agent_pid is not None and any(p.pid == snapshot.agent_pid for p in v.processes):
        return "the agent's own process"
    if pod.terminating and reason is not Reason.HARD_LIMIT:
        return "pod is already terminating"
    if not v.device.healthy:
        return f"GPU {v.device.label} is unhealthy"
    if policy.mode_for(pod.namespace) is Mode.WARN:
        return "mode is warn"
    return None


def spacing_hold(
    v: Violation,
    kind: ActionKind,
    policy: Policy,
    state: DecisionState,
    now: float,
    repeat: bool = False,
) -> str | None:
    """Why an eviction or a kill of `kind` must wait for an earlier action on the same target, or None when it may.
    `state` holds only what is still current (`decide` drops the rest).

    An eviction the API server accepted holds every further eviction of the pod, a repeat's too: the pod is going
    already. Otherwise a repeat is never held. The cooldown holds a kill while one of its container instances was
    acted on less than `cooldown_s` ago (a restarted container is a new instance: the kubelet's back-off spaces
    it) or its pod was evicted (the pod is going: its grace period is its owner's), and an eviction while the pod
    was acted on; a subject of no container instance (processes of the pod's own cgroup) is spaced per pod
    (`action_targets`).
    """
    if kind is ActionKind.EVICT and v.pod.uid in state.evicted:
        waited = format_duration(float(policy.eviction_timeout_s))
        since = now - state.evicted[v.pod.uid]
        return f"evicted {since:.1f}s ago: waiting for its deletion (eviction_timeout {waited})"
    if repeat:
        return None
    # A kill is held by a kill in the same container instance, and by an eviction of its pod: the pod is going.
    held_by = {*action_targets(v, kind), v.pod.uid}
    acted = [state.last_action_at[t] for t in held_by if t in state.last_action_at]
    if acted and now - max(acted) < policy.cooldown_s:
        return f"cool-down: acted {now - max(acted):.1f}s ago (cooldown {format_duration(float(policy.cooldown_s))})"
    return None


def action_targets(v: Violation, kind: ActionKind) -> tuple[str, ...]:
    """What an action of `kind` on `v` acts on, as the cooldown counts it: the container instances a kill reaches,
    else the pod."""
    return v.container_ids if kind is ActionKind.KILL and v.container_ids else (v.pod.uid,)


def action_kind(v: Violation, reason: Reason, policy: Policy, escalation: Escalation | None = None) -> ActionKind:
    """The namespace's mode's action (or the escalation's), except that a terminating pod is killed where it would
    be evicted.

    Evicting a pod that is already being deleted does nothing: it would keep its memory for the rest of its
    grace period, which its owner chose. (Warn mode never gets here: `hold_reason` holds it.)
    """
    kind = escalation.kind if escalation is not None else policy.mode_for(v.pod.namespace).action
    if kind is ActionKind.EVICT and v.pod.terminating and reason is Reason.HARD_LIMIT:
        return ActionKind.KILL
    return kind


# --------------------------------------------------------------------------------------------------------------
# The whole decision


def decide(
    snapshot: Snapshot,
    quotas: Mapping[str, PodQuota],
    policy: Policy,
    state: DecisionState,
    now: float,
    rows: tuple[QuotaRow, ...] | None = None,
) -> tuple[Decision, DecisionState]:
    """One scan's decision. Steps, in order:

    1. Find each row's subject and quota (`quota_rows`; or `rows`, the snapshot's rows with their owners under
       `quotas`, as the caller's `QuotaBook.rows` keeps them), and the violations: subjects above their limit on
       healthy devices.
    2. Track episodes (first observed, above the hard limit since, warned) and GPU pressure (entered at once, left
       after the transition period).
    3. Warn once per episode (also for exempt pods: a warning disrupts nothing; never the agent itself).
    4. Collect enforcements that are due: hard limit past hard_grace (at once for a repeat), soft limit past
       soft_grace, and on each GPU under memory pressure the first victim by `VICTIM_ORDER` among its violators.
    5. Rank them by `VICTIM_ORDER`, drop the ones blast-radius rules forbid (with the reason: `hold_reason`) and
       the ones an earlier action on the same target holds (`spacing_hold`: the cooldown per container instance
       killed in, or per pod evicted, never for a repeat; an accepted eviction until the pod is seen going), and
       take at most `max_actions_per_scan`, one per pod.
    6. Act in the namespace's mode, except on a terminating pod: it is acted on only over its hard limit (soft
       limit and pressure are held, "pod is already terminating"), and then killed in evict mode as in kill
       mode, since evicting a pod already being deleted does nothing. Warn mode only warns it, as any pod;
       cool-down and every other blast-radius rule apply to it as to any pod. A repeat (`repeat_of`: a GPU
       process that started after a kill in the container instance) goes one step further
       (`Policy.on_repeat_for`): every process of the container is killed, or the pod is evicted.
    7. On each GPU that entered pressure this scan (not under pressure in `state`), a notice for every pod with
       a process there, naming the subjects over their quota there (`pressure_notices`).

    Only violators are ever candidates: a pod at or under its quota is never acted on, pressure or not.
    """
    # 1.
    if rows is None:
        rows = quota_rows(snapshot, quotas)
    violations = find_violations(snapshot, rows)
    # 2.
    episodes = track_episodes(violations, state.episodes, now)
    pressure = track_pressure(snapshot.devices, policy, state.pressure, now)

    actions: list[Action] = []
    # 3.
    for v in violations:
        ep = episodes[v.key]
        if ep.warned or v.pod.uid == snapshot.agent_pod_uid:
            continue
        actions.append(Action(kind=ActionKind.WARN, reason=Reason.OVER_QUOTA, violation=v))
        episodes[v.key] = replace(ep, warned=True)

    # 4.
    kills = {cid: r for cid, r in state.kills.items() if now - r.at < policy.repeat_window_s}
    repeats = {v.key: e for v in violations if (e := repeat_of(v, policy, kills, now)) is not None}
    due: dict[Subject, tuple[Violation, Reason]] = {}
    for v in violations:
        reason = due_reason(v, episodes[v.key], policy, now, repeat=v.key in repeats)
        if reason is not None:
            due[v.key] = (v, reason)
    pressured_devices = tuple(d.uuid for d in snapshot.devices if d.uuid in pressure)
    for uuid in pressured_devices:
        on_device = rank(v for v in violations if v.device.uuid == uuid)
        if on_device and not any(v.device.uuid == uuid for v, _ in due.values()):
            due[on_device[0].key] = (on_device[0], Reason.GPU_PRESSURE)

    # 5.
    held: list[Held] = []
    last_action_at = {uid: t for uid, t in state.last_action_at.items() if now - t < policy.cooldown_s}
    going = {u.pod.uid for u in snapshot.containers if u.pod.terminating}
    evicted = {
        uid: t
        for uid, t in state.evicted.items()
        if now - t < policy.eviction_timeout_s and uid in quotas and uid not in going
    }
    recent = DecisionState(last_action_at=last_action_at, kills=kills, evicted=evicted)
    acted_pods: set[str] = set()
    taken = 0
    ranked = rank(v for v, _ in due.values())
    for v, reason in ((v, due[v.key][1]) for v in ranked):
        escalation = repeats.get(v.key)
        kind = action_kind(v, reason, policy, escalation)
        why = "pod already acted on in this scan" if v.pod.uid in acted_pods else None
        why = why or hold_reason(v, reason, policy, snapshot)
        why = why or spacing_hold(v, kind, policy, recent, now, repeat=escalation is not None)
        if why is None and taken >= policy.max_actions_per_scan:
            why = f"max_actions_per_scan={policy.max_actions_per_scan} reached"
        if why is not None:
            held.append(Held(violation=v, reason=reason, why=why))
            continue
        # 6.
        actions.append(Action(kind=kind, reason=reason, violation=v, escalation=escalation))
        acted_pods.add(v.pod.uid)
        last_action_at.update(dict.fromkeys(action_targets(v, kind), now))
        taken += 1

    # 7.
    entered = (uuid for uuid in pressured_devices if uuid not in state.pressure)
    decision = Decision(
        actions=tuple(actions),
        violations=violations,
        held=tuple(held),
        rows=rows,
        pressured_devices=pressured_devices,
        notices=pressure_notices(snapshot, rows, violations, entered),
    )
    return decision, DecisionState(
        episodes=MappingProxyType(episodes),
        last_action_at=MappingProxyType(last_action_at),
        pressure=MappingProxyType(pressure),
        kills=MappingProxyType(kills),
        evicted=MappingProxyType(evicted),
    )
