"""Rows as text: a table (`wide` adds columns), JSON or YAML. Pure: the caller says whether to colour.

The table is for people, laid out as `vramguard top` lays out its own (`core/table.py`): tenant text escaped, the
state coloured only when asked (a terminal); JSON and YAML carry the exact text, for programs.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any

import yaml

from vramguard.core.quantity import format_quantity
from vramguard.core.table import CONTAINER_COLUMNS, bytes_cell, command_cell, layout, percent_cell
from vramguard.core.text import printable
from vramguard.plugin.merge import GpuRow, Level, Row
from vramguard.plugin.patch import Patch
from vramguard.plugin.recommend import POD_WIDE, Recommendation
from vramguard.plugin.verdict import Verdict


class Output(str, enum.Enum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


# ANSI SGR: over quota red, near it yellow, fine green, no answer or a stale scan magenta.
_COLOURS = {Level.over: "\x1b[1;31m", Level.near: "\x1b[33m", Level.fine: "\x1b[32m", Level.problem: "\x1b[35m"}
PRESSURE_MARK = " (GPU under pressure)"


def _state(r: Row) -> str:
    if r.error and r.agent:  # the table has no AGENT column (but in wide): name the agent that gave no rows
        return f"no answer from {r.agent}: {r.error}"
    return r.state + PRESSURE_MARK if r.at_risk else r.state


def _gpu_state(g: GpuRow) -> str:
    return f"no answer from {g.agent}: {g.error}" if g.error and g.agent else g.state


def _table(
    header: Sequence[str],
    lines: Sequence[Sequence[str]],
    levels: Sequence[Level],
    colour: bool,
    coloured: str = "STATE",
) -> str:
    """The shared layout; with `colour`, the `coloured` column coloured by each line's level."""
    return layout(header, lines, [_COLOURS[level] for level in levels] if colour else (), coloured)


TOP_HEADER = ("NODE", *CONTAINER_COLUMNS)
TOP_WIDE = ("QUOTA-SOURCE", "CLAIM", "PIDS", "AGENT", "VERSION", "COMMAND")


def top_table(rows: Sequence[Row], wide: bool = False, colour: bool = False) -> str:
    header = TOP_HEADER + TOP_WIDE if wide else TOP_HEADER
    lines: list[tuple[str, ...]] = []
    for r in rows:
        line: tuple[str, ...] = (
            r.node,
            r.gpu,
            r.namespace,
            r.pod,
            r.container,
            bytes_cell(r.used_bytes),
            bytes_cell(r.quota_bytes),
            percent_cell(r.percent),
            _state(r),
            r.held_by,
        )
        if wide:
            pids = ",".join(map(str, r.pids[:8])) + (",..." if len(r.pids) > 8 else "")
            line += (
                r.quota_source or "-",
                r.claim or "-",
                pids or "-",
                r.agent or "-",
                r.agent_version or "-",
                command_cell(r.command) or "-",
            )
        lines.append(line)
    if not rows:
        return "No GPU processes."
    return _table(header, lines, [r.level for r in rows], colour)


NODES_HEADER = ("NODE", "GPU", "NAME", "TOTAL", "USED", "UNDER-QUOTA", "UNATTRIBUTED", "FREE", "LIMITS", "STATE")


def nodes_table(rows: Sequence[GpuRow], wide: bool = False, colour: bool = False) -> str:
    header = (*NODES_HEADER, "UUID", "AGENT") if wide else NODES_HEADER
    lines: list[tuple[str, ...]] = []
    for g in rows:
        line: tuple[str, ...] = (
            g.node,
            g.gpu,
            g.name or "-",
            bytes_cell(g.total_bytes),
            bytes_cell(g.used_bytes),
            bytes_cell(g.under_quota_bytes),
            bytes_cell(g.unattributed_bytes),
            bytes_cell(g.free_bytes),
            g.limits,
            _gpu_state(g),
        )
        if wide:
            line += (g.uuid or "-", g.agent or "-")
        lines.append(line)
    if not rows:
        return "No GPUs."
    return _table(header, lines, [g.level for g in rows], colour)


def row_dict(r: Row) -> dict[str, Any]:
    return {
        "node": r.node,
        "gpu": r.gpu,
        "namespace": r.namespace,
        "pod": r.pod,
        "container": r.container,
        "used_bytes": r.used_bytes,
        "quota_bytes": r.quota_bytes,
        "percent": r.percent,
        "state": r.state,
        "held_by": r.held_by,
        "claim": r.claim,
        "quota_source": r.quota_source,
        "pids": list(r.pids),
        "command": r.command,
        "pressure": r.pressure,
        "at_risk": r.at_risk,
        "agent": r.agent,
        "agent_version": r.agent_version,
        "scan_age_s": r.scan_age_s,
        "stale": r.stale,
        "error": r.error,
    }


def gpu_dict(g: GpuRow) -> dict[str, Any]:
    return {
        "node": g.node,
        "gpu": g.gpu,
        "name": g.name,
        "uuid": g.uuid,
        "total_bytes": g.total_bytes,
        "used_bytes": g.used_bytes,
        "under_quota_bytes": g.under_quota_bytes,
        "unattributed_bytes": g.unattributed_bytes,
        "free_bytes": g.free_bytes,
        "limits": g.limits,
        "healthy": g.healthy,
        "pressure": g.pressure,
        "state": g.state,
        "needs_reset": g.needs_reset,
        "held_by_exited_bytes": g.held_by_exited_bytes,
        "orphaned_bytes": g.orphaned_bytes,
        "agent": g.agent,
        "stale": g.stale,
        "error": g.error,
    }


def document(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": kind, "items": items}


def dump(doc: dict[str, Any], output: Output) -> str:
    """JSON or YAML, the text exact (JSON escapes what needs it; YAML quotes it)."""
    if output is Output.json:
        return json.dumps(doc, indent=2)
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=False).rstrip("\n")


def render_top(rows: Sequence[Row], output: Output, colour: bool = False) -> str:
    if output in (Output.json, Output.yaml):
        return dump(document("VramguardTop", [row_dict(r) for r in rows]), output)
    return top_table(rows, wide=output is Output.wide, colour=colour)


def render_nodes(rows: Sequence[GpuRow], output: Output, colour: bool = False) -> str:
    if output in (Output.json, Output.yaml):
        return dump(document("VramguardNodes", [gpu_dict(g) for g in rows]), output)
    return nodes_table(rows, wide=output is Output.wide, colour=colour)


# --------------------------------------------------------------------------------------------------------------
# recommend


class RecommendOutput(str, enum.Enum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    patch = "patch"  # a `kubectl patch` command per workload whose quota is not ok


_VERDICT_LEVELS = {
    Verdict.KILLED: Level.over,
    Verdict.WASTEFUL: Level.near,
    Verdict.NO_QUOTA: Level.near,
    Verdict.OK: Level.fine,
    Verdict.UNKNOWN: Level.problem,
}
RECOMMEND_HEADER = ("NAMESPACE", "WORKLOAD", "CONTAINER", "PODS", "GPUS", "PEAK", "RECOMMENDED", "QUOTA", "SOURCE")
RECOMMEND_WIDE = ("FIELD", "NOTES")


def _container(r: Recommendation) -> str:
    return f"(pod: {', '.join(r.containers)})" if r.container == POD_WIDE else r.container


def recommend_table(rows: Sequence[Recommendation], wide: bool = False, colour: bool = False) -> str:
    header = (*RECOMMEND_HEADER, "VERDICT", *(RECOMMEND_WIDE if wide else ()))
    lines: list[tuple[str, ...]] = []
    for r in rows:
        line: tuple[str, ...] = (
            r.workload.namespace,
            str(r.workload),
            _container(r),
            str(r.pods),
            str(r.gpus),
            bytes_cell(r.peak_bytes),
            format_quantity(r.recommended_bytes),  # exact, as it would be written
            format_quantity(r.quota_bytes) if r.quota_bytes is not None else "-",
            r.quota_source or "-",
            r.verdict.value,
        )
        if wide:
            line += (f"{r.target_field}={r.value}", "; ".join(r.notes) or "-")
        lines.append(line)
    if not rows:
        return "No workload used GPU memory in the window."
    return _table(header, lines, [_VERDICT_LEVELS[r.verdict] for r in rows], colour, coloured="VERDICT")


def recommendation_dict(r: Recommendation) -> dict[str, Any]:
    return {
        "namespace": r.workload.namespace,
        "kind": r.workload.kind,
        "name": r.workload.name,
        "container": r.container,
        "containers": list(r.containers),
        "pods": r.pods,
        "gpus": r.gpus,
        "peak_bytes": r.peak_bytes,
        "recommended_bytes": r.recommended_bytes,
        "quota_bytes": r.quota_bytes,
        "quota_source": r.quota_source,
        "verdict": r.verdict.value,
        "field": {"kind": r.target.kind.value, "name": r.target_key, "value": r.value},
        "notes": list(r.notes),
    }


def patch_dict(p: Patch) -> dict[str, Any]:
    ref = p.workload
    return {"namespace": ref.namespace, "kind": ref.kind, "name": ref.name, "patch": p.body, "why": p.why}


def render_recommend(
    rows: Sequence[Recommendation],
    patches: Sequence[Patch],
    facts: dict[str, Any],
    caveats: Sequence[str],
    output: RecommendOutput,
    colour: bool = False,
) -> str:
    """The rows as `output` asks; `facts` (the window, the headroom, where the peaks come from, which agents they
    were read from) and `caveats` go in the document; the agents and the caveats under the table."""
    if output in (RecommendOutput.json, RecommendOutput.yaml):
        doc = {
            "kind": "VramguardRecommendation",
            **facts,
            "caveats": list(caveats),
            "items": [recommendation_dict(r) for r in rows],
            "patches": [patch_dict(p) for p in patches],
        }
        return dump(doc, Output.json if output is RecommendOutput.json else Output.yaml)
    agents = [f"# agents: {printable(str(facts['agents']))}"] if facts.get("agents") else []
    notes = [*agents, *(f"# {printable(c)}" for c in caveats)]
    if output is RecommendOutput.patch:
        return "\n".join([*notes, *([printable(p.command()) for p in patches] or ["# nothing to change"])])
    table = recommend_table(rows, wide=output is RecommendOutput.wide, colour=colour)
    return "\n".join([table, *notes])
