"""`kubectl vramguard`'s merge: many agents' status documents (some missing, stale, or from an older agent) made
into `top`'s and `nodes`' rows, filtered and sorted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vramguard.core.quantity import GiB
from vramguard.plugin.merge import (
    Answer,
    Failure,
    Fetched,
    Level,
    SortBy,
    filter_rows,
    merge_nodes,
    merge_rows,
    partial,
    sort_rows,
)
from vramguard.plugin.render import Output, nodes_table, render_nodes

from .agents import (
    answer,
    container_doc,
    fleet,
    gpu_doc,
    ref,
    rows_of,
    status_doc,
)


def test_every_agent_is_in_the_table_and_the_silent_one_says_why() -> None:
    """Every agent is in the table: one that did not answer is a problem row saying why, and the answer is partial."""
    rows = merge_rows(fleet())
    assert len(rows_of(rows, "node-a")) == 4
    assert [(r.namespace, r.pod) for r in rows_of(rows, "node-b")] == [("team-b", "batch")]
    [silent] = rows_of(rows, "node-d")
    assert silent.state == "no answer: 503 Service Unavailable: connection refused"
    assert silent.agent == "vramguard/vramguard-node-d"
    assert silent.level is Level.problem
    assert partial(fleet())
    assert not partial(fleet()[:3])


def test_many_agents_merge() -> None:
    """Two hundred agents merge into one row each, the one that failed a row saying why."""
    fetched: list[Fetched] = [
        answer(f"node-{i:03}", [gpu_doc("0")], [container_doc(f"ns-{i % 7}", f"p{i}", i * GiB, 100 * GiB)])
        for i in range(200)
    ]
    fetched[17] = Failure(ref("node-017"), "timed out after 5s")
    rows = merge_rows(fetched)
    assert len(rows) == 200
    assert {r.node for r in rows} == {f"node-{i:03}" for i in range(200)}
    assert [r.state for r in rows if r.error] == ["no answer: timed out after 5s"]


def test_a_stale_agent_is_marked_on_every_row() -> None:
    """Every row of an agent whose last scan is old is marked stale and a problem, in both views."""
    stale = answer("node-s", [gpu_doc("0")], [container_doc("t", "p", GiB, 2 * GiB)], scan_age_s=600.0)
    fresh = answer("node-f", [gpu_doc("0")], [container_doc("t", "q", GiB, 2 * GiB)], scan_age_s=3.0)
    rows = merge_rows([stale, fresh])
    [s] = rows_of(rows, "node-s")
    [f] = rows_of(rows, "node-f")
    assert s.stale and s.state == "ok (stale: last scan 600s ago)" and s.level is Level.problem
    assert not f.stale and f.state == "ok" and f.level is Level.fine
    [g] = merge_nodes([stale])
    assert g.stale and g.state.startswith("stale")


def test_an_agent_before_its_first_scan_is_a_row() -> None:
    """An agent before its first scan is one row saying so, in both views."""
    fetched: list[Fetched] = [answer("node-n", [], [], scan_age_s=None)]
    assert [(r.node, r.state) for r in merge_rows(fetched)] == [("node-n", "no scan yet")]
    assert [(g.node, g.state) for g in merge_nodes(fetched)] == [("node-n", "no scan yet")]


def test_an_older_agents_document_is_read_with_defaults() -> None:
    """An older agent's document is read with defaults for the fields it lacks, and a junk row reads as unknown."""
    old_gpu = {"gpu": "0", "uuid": "GPU-0", "name": "A100", "total_bytes": 40 * GiB, "used_bytes": 9 * GiB}
    old_row = {"gpu": "0", "namespace": "t", "pod": "p", "container": "c", "used_bytes": 9 * GiB}
    old_row |= {"quota_bytes": 10 * GiB, "state": "ok", "processes": [{"pid": 7}]}
    doc = {"kind": "VramguardStatus", "agent": {"version": "0.1.0", "node": "node-o"}, "gpus": [old_gpu]}
    doc["containers"] = [old_row, "not a row", {"used_bytes": "lots"}]
    [row, junk] = merge_rows([Answer(ref("node-o"), doc)])
    assert (row.held_by, row.quota_source, row.pids, row.agent_version) == ("-", "", (7,), "0.1.0")
    assert row.percent == pytest.approx(90.0)
    assert row.level is Level.near
    assert (junk.used_bytes, junk.pod, junk.state) == (None, "?", "?")
    [g] = merge_nodes([Answer(ref("node-o"), doc)])
    assert (g.limits, g.pressure, g.free_bytes, g.under_quota_bytes) == ("-", False, None, 9 * GiB)


@pytest.mark.parametrize(
    ("document", "why"),
    [
        pytest.param(["a list"], "not a status document (a JSON list)", id="a-list"),
        pytest.param({"kind": "Status"}, "not a status document (kind 'Status')", id="another-kind"),
    ],
)
def test_something_else_than_a_status_is_a_failure_row(document: Any, why: str) -> None:
    """A document that is no status document is a failure row in both views, and the answer is partial."""
    fetched = [Answer(ref("node-x"), document)]
    [row] = merge_rows(fetched)
    assert row.state == f"no answer: {why}"
    assert partial(fetched)
    [g] = merge_nodes(fetched)
    assert g.state == f"no answer: {why}"


def test_a_truncated_document_says_so() -> None:
    """A document the agent truncated adds a row saying how many rows it did not send."""
    doc = status_doc("node-t", [gpu_doc("0")], [container_doc("t", "p", GiB, None, "unmanaged")])
    doc["truncated"] = 12
    rows = merge_rows([Answer(ref("node-t"), doc)])
    assert "truncated: 12 more rows not sent by the agent" in [r.state for r in rows]


@pytest.mark.parametrize(
    ("namespace", "node", "want"),
    [
        pytest.param(None, None, 7, id="all"),
        pytest.param("team-a", None, 3, id="namespace-keeps-the-silent-agent"),
        pytest.param("team-b", "node-b", 1, id="namespace-and-node"),
        pytest.param(None, "node-d", 1, id="node-of-the-silent-agent"),
        pytest.param("nobody", "node-c", 0, id="nothing"),
    ],
)
def test_filters(namespace: str | None, node: str | None, want: int) -> None:
    """Filters keep a namespace's and a node's rows; a silent agent's row stays under any namespace."""
    rows = filter_rows(merge_rows(fleet()), namespace, node)
    assert len(rows) == want
    assert all(node is None or r.node == node for r in rows)
    assert all(namespace is None or r.namespace in (namespace, "-") for r in rows)


@pytest.mark.parametrize(
    ("by", "first"),
    [
        pytest.param(None, ("node-a", "0", "-"), id="place"),
        pytest.param(SortBy.used, ("node-a", "0", "train"), id="used"),
        pytest.param(SortBy.overage, ("node-a", "0", "train"), id="overage"),
        pytest.param(SortBy.quota, ("node-c", "0", "edge"), id="quota"),
    ],
)
def test_sort_orders(by: SortBy | None, first: tuple[str, str, str]) -> None:
    """Rows sort by place, used, overage or quota, a row without the value last."""
    rows = sort_rows(merge_rows(fleet()), by)
    assert (rows[0].node, rows[0].gpu, rows[0].pod) == first
    assert rows[-1].node == "node-d" or by is None  # a row without a value sorts last
    if by is SortBy.overage:
        assert [r.pod for r in rows[:3]] == ["train", "big", "edge"]  # +4Gi, +1Gi, -1Gi


def test_nodes_totals() -> None:
    """`nodes` gives each GPU its total, used, free, under-quota and unattributed memory, its limits and pressure."""
    gpus = merge_nodes(fleet())
    by_key = {(g.node, g.gpu): g for g in gpus}
    a0 = by_key["node-a", "0"]
    assert a0.under_quota_bytes == 28 * GiB  # train 20 + serve 8; the unattributed 2 has no quota
    assert a0.unattributed_bytes == 2 * GiB
    assert (a0.total_bytes, a0.used_bytes, a0.free_bytes, a0.limits) == (80 * GiB, 30 * GiB, 50 * GiB, "driver")
    assert a0.state == "pressure" and a0.level is Level.over
    assert by_key["node-a", "1"].under_quota_bytes == 5 * GiB
    assert by_key["node-b", "0"].under_quota_bytes == 0  # unmanaged: no quota
    assert by_key["node-d", "-"].state.startswith("no answer")
    assert [g.node for g in merge_nodes(fleet(), node="node-c")] == ["node-c"]


def test_nodes_shows_an_unhealthy_gpu() -> None:
    """`nodes` shows an unhealthy GPU as a problem, with its error."""
    bad = answer("node-u", [gpu_doc("0", healthy=False, error="GPU is lost")], [])
    [g] = merge_nodes([bad])
    assert g.state == "unhealthy: GPU is lost" and g.level is Level.problem


def test_nodes_shows_a_gpu_that_needs_a_reset() -> None:
    """`nodes` shows a GPU whose memory exited processes hold as a problem that needs a reset, with the bytes; an
    older agent's GPU, without the field, is fine."""
    stuck = answer("node-r", [gpu_doc("0", needs_reset=True, held_by_exited_bytes=2 * GiB), gpu_doc("1")], [])
    reset, fine = merge_nodes([stuck])
    assert reset.state == "needs a reset: 2.0GiB held by exited processes" and reset.level is Level.problem
    assert (reset.needs_reset, reset.held_by_exited_bytes) == (True, 2 * GiB)
    assert (fine.state, fine.level, fine.needs_reset, fine.held_by_exited_bytes) == ("ok", Level.fine, False, None)
    assert "needs a reset: 2.0GiB held by exited processes" in nodes_table([reset, fine])


ORPHANED = "orphaned: 3.0GiB of pods that are gone"


@pytest.mark.parametrize(
    ("fields", "scan_age_s", "state", "level", "orphaned"),
    [
        pytest.param({"orphaned_bytes": 3 * GiB}, 1.0, ORPHANED, Level.problem, 3 * GiB, id="orphaned"),
        pytest.param(
            {"orphaned_bytes": 3 * GiB, "pressure": True}, 1.0, ORPHANED, Level.problem, 3 * GiB, id="over-pressure"
        ),
        pytest.param({"orphaned_bytes": 0}, 1.0, "ok", Level.fine, 0, id="none-orphaned"),
        pytest.param({"orphaned_bytes": 0, "pressure": True}, 1.0, "pressure", Level.over, 0, id="pressure-alone"),
        pytest.param({}, 1.0, "ok", Level.fine, None, id="an-older-agent-without-the-field"),
        pytest.param(
            {"orphaned_bytes": 3 * GiB, "needs_reset": True, "held_by_exited_bytes": GiB},
            1.0,
            "needs a reset: 1.0GiB held by exited processes",
            Level.problem,
            3 * GiB,
            id="a-needed-reset-comes-first",
        ),
        pytest.param(
            {"orphaned_bytes": 3 * GiB, "healthy": False, "error": "GPU is lost"},
            1.0,
            "unhealthy: GPU is lost",
            Level.problem,
            3 * GiB,
            id="unhealthy-comes-first",
        ),
        pytest.param({"orphaned_bytes": 3 * GiB}, 600.0, "stale", Level.problem, 3 * GiB, id="a-stale-scan-first"),
    ],
)
def test_nodes_shows_what_orphans_hold_on_a_gpu(
    fields: dict[str, Any], scan_age_s: float, state: str, level: Level, orphaned: int | None
) -> None:
    """`nodes` says how much the processes of pods that are gone hold on a GPU, as a problem, unless something
    worse applies to it (a stale scan, an unhealthy GPU, a GPU that needs a reset); the table and JSON carry it."""
    [g] = merge_nodes([answer("node-o", [gpu_doc("0", **fields)], [], scan_age_s=scan_age_s)])
    shown = g.state.split(":")[0] if state == "stale" else g.state  # "stale: last scan 600s ago"
    assert (shown, g.level, g.orphaned_bytes) == (state, level, orphaned)
    assert g.state in nodes_table([g])
    assert json.loads(render_nodes([g], Output.json))["items"][0]["orphaned_bytes"] == orphaned
