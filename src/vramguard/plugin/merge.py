"""Agents' status documents (and the agents that did not answer) into rows: pure, no I/O.

A document is read leniently: an older agent leaves fields out, a newer one adds some, and either may hold a
value of an unexpected type. What is missing takes a neutral default; the agent is never dropped for it. An agent
that did not answer, or answered something that is not a status, is a row of its own saying why.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vramguard.core.text import cut, format_bytes

STATUS_KIND = "VramguardStatus"
SCHEMA = 1  # the newest schema this plugin knows; a newer agent's document is read for the fields it knows
NEAR_PERCENT = 90.0  # a row at or above this share of its quota is "near" it
# An agent's last scan is stale when older than this many poll intervals (and than STALE_FLOOR_S): the agent
# answers, but its scan loop is stuck or slow.
STALE_INTERVALS = 3.0
STALE_FLOOR_S = 30.0
MAX_REASON_CHARS = 300


@dataclass(frozen=True, slots=True)
class AgentRef:
    """One agent pod: where it runs, and how it was reached."""

    namespace: str
    pod: str
    node: str


@dataclass(frozen=True, slots=True)
class Answer:
    agent: AgentRef
    document: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Failure:
    agent: AgentRef
    reason: str  # one short line: "connection refused", "403 Forbidden: ...", "timed out after 5s"


Fetched = Answer | Failure


class SortBy(str, enum.Enum):
    used = "used"
    overage = "overage"
    quota = "quota"


class Level(enum.Enum):
    """How a row reads at a glance (its colour on a terminal)."""

    fine = "fine"
    near = "near"
    over = "over"
    problem = "problem"  # no answer, a stale scan, an unhealthy GPU


@dataclass(frozen=True, slots=True)
class Row:
    node: str
    gpu: str
    namespace: str
    pod: str
    container: str
    used_bytes: int | None  # None on a row that stands for an agent without an answer
    quota_bytes: int | None
    percent: float | None
    state: str
    held_by: str
    claim: str = ""
    quota_source: str = ""
    pids: tuple[int, ...] = ()
    command: str = ""  # the first process's command line
    agent: str = ""  # namespace/pod of the agent that reported the row
    agent_version: str = ""
    scan_age_s: float | None = None
    stale: bool = False
    pressure: bool = False  # the GPU was under memory pressure in the agent's last scan
    error: str = ""  # why the agent gave no rows: set on that agent's one row only

    @property
    def over_quota(self) -> bool:
        return self.state.startswith("over-")

    @property
    def at_risk(self) -> bool:
        """Over quota on a GPU under memory pressure: the container the pressure is likely to fall on."""
        return self.over_quota and self.pressure

    @property
    def overage_bytes(self) -> int | None:
        if self.used_bytes is None or self.quota_bytes is None:
            return None
        return self.used_bytes - self.quota_bytes

    @property
    def level(self) -> Level:
        if self.error or self.stale or self.state.startswith("gpu-unhealthy"):
            return Level.problem
        if self.over_quota:
            return Level.over
        if self.percent is not None and self.percent >= NEAR_PERCENT:
            return Level.near
        return Level.fine


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU of one node (`kubectl vramguard nodes`)."""

    node: str
    gpu: str
    name: str
    uuid: str
    total_bytes: int | None
    used_bytes: int | None
    under_quota_bytes: int | None  # used by containers with a quota
    unattributed_bytes: int | None  # used by processes no pod was found for
    free_bytes: int | None
    limits: str  # "driver" | "agent" | "-" (unknown: an older agent, or no answer)
    healthy: bool
    pressure: bool
    # ok | pressure | unhealthy: <error> | needs a reset: ... | orphaned: ... | stale: ... | no answer: <why>
    state: str
    agent: str = ""
    stale: bool = False
    error: str = ""
    # Memory exited processes hold past a teardown: only a GPU reset frees it (None: an older agent's document).
    held_by_exited_bytes: int | None = None
    needs_reset: bool = False
    # Memory the processes of pods that are gone hold (orphans; None: an older agent's document).
    orphaned_bytes: int | None = None

    @property
    def level(self) -> Level:
        if self.error or self.stale or not self.healthy or self.needs_reset or self.orphaned_bytes:
            return Level.problem
        return Level.over if self.pressure else Level.fine


# --------------------------------------------------------------------------------------------------------------
# Reading a document leniently


def _str(d: Mapping[str, Any], key: str, default: str = "") -> str:
    v = d.get(key)
    return cut(v) if isinstance(v, str) else default


def _int(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _float(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _bool(d: Mapping[str, Any], key: str, default: bool = False) -> bool:
    v = d.get(key)
    return v if isinstance(v, bool) else default


def _dicts(d: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    v = d.get(key)
    return [x for x in v if isinstance(x, Mapping)] if isinstance(v, list) else []


def not_a_status(document: object) -> str | None:
    """Why `document` is not an agent's status document, or None when it is one."""
    if not isinstance(document, Mapping):
        return f"not a status document (a JSON {type(document).__name__})"
    kind = document.get("kind")
    if kind != STATUS_KIND:
        return f"not a status document (kind {cut(str(kind), 64)!r})"
    return None


def is_stale(scan_age_s: float | None, poll_interval_s: float | None) -> bool:
    if scan_age_s is None:
        return False
    return scan_age_s > max(STALE_INTERVALS * (poll_interval_s or 0.0), STALE_FLOOR_S)


@dataclass(frozen=True, slots=True)
class _AgentInfo:
    ref: str
    node: str
    version: str
    scan_age_s: float | None
    stale: bool
    no_scan: bool


def _agent_info(answer: Answer) -> _AgentInfo:
    agent = answer.document.get("agent")
    info: Mapping[str, Any] = agent if isinstance(agent, Mapping) else {}
    scan_age = _float(info, "scan_age_s")
    return _AgentInfo(
        ref=f"{answer.agent.namespace}/{answer.agent.pod}",
        # The pod's node, from the API server, unless the agent says otherwise (it names the node it watches).
        node=_str(info, "node") or answer.agent.node,
        version=_str(info, "version", "?"),
        scan_age_s=scan_age,
        stale=is_stale(scan_age, _float(info, "poll_interval_s")),
        no_scan="scan_age_s" in info and info["scan_age_s"] is None,
    )


def _stale_note(a: _AgentInfo) -> str:
    return f"stale: last scan {a.scan_age_s:.0f}s ago"


def _failure_row(f: Failure) -> Row:
    reason = cut(f.reason, MAX_REASON_CHARS)
    return Row(
        node=f.agent.node or "?",
        gpu="-",
        namespace="-",
        pod="-",
        container="-",
        used_bytes=None,
        quota_bytes=None,
        percent=None,
        state=f"no answer: {reason}",
        held_by="-",
        agent=f"{f.agent.namespace}/{f.agent.pod}",
        error=reason,
    )


def _container_rows(answer: Answer) -> list[Row]:
    a = _agent_info(answer)
    gpus = {_str(g, "gpu"): g for g in _dicts(answer.document, "gpus")}
    rows: list[Row] = []
    if a.no_scan:
        rows.append(
            Row(a.node, "-", "-", "-", "-", None, None, None, "no scan yet", "-", agent=a.ref, agent_version=a.version)
        )
    for c in _dicts(answer.document, "containers"):
        gpu = _str(c, "gpu", "?")
        used, quota = _int(c, "used_bytes"), _int(c, "quota_bytes")
        percent = _float(c, "percent")
        if percent is None and used is not None and quota:
            percent = 100.0 * used / quota  # an older agent's row without it
        state = _str(c, "state", "?")
        processes = _dicts(c, "processes")
        listed = c.get("pids")
        pids = tuple(p for p in listed if isinstance(p, int)) if isinstance(listed, list) else ()
        rows.append(
            Row(
                node=a.node,
                gpu=gpu,
                namespace=_str(c, "namespace", "?"),
                pod=_str(c, "pod", "?"),
                container=_str(c, "container", "?"),
                used_bytes=used,
                quota_bytes=quota,
                percent=percent,
                state=f"{state} ({_stale_note(a)})" if a.stale else state,
                held_by=_str(c, "held_by", "-"),
                claim=_str(c, "claim"),
                quota_source=_str(c, "quota_source"),
                pids=pids or tuple(p for p in (_int(x, "pid") for x in processes) if p is not None),
                command=_str(processes[0], "command") if processes else "",
                agent=a.ref,
                agent_version=a.version,
                scan_age_s=a.scan_age_s,
                stale=a.stale,
                pressure=_bool(gpus.get(gpu, {}), "pressure"),
            )
        )
    truncated = _int(answer.document, "truncated")
    if truncated:
        rows.append(
            Row(
                a.node,
                "-",
                "-",
                "-",
                "-",
                None,
                None,
                None,
                f"truncated: {truncated} more rows not sent by the agent",
                "-",
                agent=a.ref,
                agent_version=a.version,
            )
        )
    return rows


def merge_rows(fetched: Iterable[Fetched]) -> list[Row]:
    """Every agent's container rows, and one row per agent that gave none (no answer, no scan yet)."""
    rows: list[Row] = []
    for f in fetched:
        if isinstance(f, Failure):
            rows.append(_failure_row(f))
            continue
        why = not_a_status(f.document)
        if why is not None:
            rows.append(_failure_row(Failure(f.agent, why)))
            continue
        rows.extend(_container_rows(f))
    return rows


def _agent_row(row: Row) -> bool:
    """A row about an agent rather than a container (no answer, no scan yet, truncated)."""
    return row.gpu == "-" and row.namespace == "-" and row.agent != ""


def filter_rows(rows: Iterable[Row], namespace: str | None = None, node: str | None = None) -> list[Row]:
    """The rows of `namespace` (None: all) on `node` (None: all). A row about an agent is kept whatever the
    namespace: an agent that did not answer may hold that namespace's rows."""
    return [
        r
        for r in rows
        if (node is None or r.node == node) and (namespace is None or r.namespace == namespace or _agent_row(r))
    ]


def _descending(value: int | None) -> tuple[int, int]:
    return (0, -value) if value is not None else (1, 0)  # rows without a value last


def sort_rows(rows: Sequence[Row], by: SortBy | None = None) -> list[Row]:
    """By node, GPU, namespace, pod, container; or largest first by `by`, ties in that order."""
    place = sorted(rows, key=lambda r: (r.node, r.gpu, r.namespace, r.pod, r.container, r.state))
    if by is None:
        return place
    if by is SortBy.used:
        return sorted(place, key=lambda r: _descending(r.used_bytes))
    if by is SortBy.quota:
        return sorted(place, key=lambda r: _descending(r.quota_bytes))
    return sorted(place, key=lambda r: _descending(r.overage_bytes))


# --------------------------------------------------------------------------------------------------------------
# Nodes


def merge_nodes(fetched: Iterable[Fetched], node: str | None = None) -> list[GpuRow]:
    """Per node and GPU: total, used, used under quota, unattributed, free, and whether the driver holds limits;
    one row per agent that gave none."""
    out: list[GpuRow] = []
    for f in fetched:
        why = f.reason if isinstance(f, Failure) else not_a_status(f.document)
        if why is not None:
            reason = cut(why, MAX_REASON_CHARS)
            out.append(
                GpuRow(
                    f.agent.node or "?",
                    "-",
                    "",
                    "",
                    None,
                    None,
                    None,
                    None,
                    None,
                    "-",
                    False,
                    False,
                    f"no answer: {reason}",
                    agent=f"{f.agent.namespace}/{f.agent.pod}",
                    error=reason,
                )
            )
            continue
        assert isinstance(f, Answer)
        a = _agent_info(f)
        containers = _container_rows(f)
        if a.no_scan:
            out.append(
                GpuRow(a.node, "-", "", "", None, None, None, None, None, "-", True, False, "no scan yet", agent=a.ref)
            )
        for g in _dicts(f.document, "gpus"):
            label = _str(g, "gpu", "?")
            on_gpu = [r for r in containers if r.gpu == label and r.used_bytes is not None]
            healthy = _bool(g, "healthy", True)
            pressure = _bool(g, "pressure")
            needs_reset = _bool(g, "needs_reset")
            held_by_exited = _int(g, "held_by_exited_bytes")
            orphaned = _int(g, "orphaned_bytes")
            if a.stale:
                state = _stale_note(a)
            elif not healthy:
                state = f"unhealthy: {_str(g, 'error')}"
            elif needs_reset:
                state = f"needs a reset: {format_bytes(held_by_exited or 0)} held by exited processes"
            elif orphaned:
                state = f"orphaned: {format_bytes(orphaned)} of pods that are gone"
            else:
                state = "pressure" if pressure else "ok"
            out.append(
                GpuRow(
                    node=a.node,
                    gpu=label,
                    name=_str(g, "name"),
                    uuid=_str(g, "uuid"),
                    total_bytes=_int(g, "total_bytes"),
                    used_bytes=_int(g, "used_bytes"),
                    under_quota_bytes=sum(r.used_bytes or 0 for r in on_gpu if r.quota_bytes is not None),
                    unattributed_bytes=sum(r.used_bytes or 0 for r in on_gpu if r.state.startswith("unattributed")),
                    free_bytes=_int(g, "free_bytes"),
                    limits=_str(g, "limits", "-") or "-",
                    healthy=healthy,
                    pressure=pressure,
                    state=state,
                    agent=a.ref,
                    stale=a.stale,
                    held_by_exited_bytes=held_by_exited,
                    needs_reset=needs_reset,
                    orphaned_bytes=orphaned,
                )
            )
    rows = [r for r in out if node is None or r.node == node]
    return sorted(rows, key=lambda r: (r.node, r.gpu))


def partial(fetched: Iterable[Fetched]) -> bool:
    """Some agent gave no status (no answer, or not a status document)."""
    return any(isinstance(f, Failure) or not_a_status(f.document) is not None for f in fetched)
