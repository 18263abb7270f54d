"""`kubectl vramguard`'s output: the `top` and `nodes` tables (tenant text escaped, colour only when asked) and
JSON/YAML that round-trips."""

from __future__ import annotations

import json

import pytest
import yaml

from vramguard.core.quantity import GiB
from vramguard.core.table import TABLE_COMMAND_CHARS
from vramguard.plugin.merge import Row, merge_nodes, merge_rows, sort_rows
from vramguard.plugin.render import Output, render_nodes, render_top, row_dict

from .agents import answer, container_doc, fleet, gpu_doc


def test_pods_over_quota_on_a_gpu_under_pressure_are_marked() -> None:
    """Only a pod over its hard quota on a GPU under pressure is marked at risk, in the table and in JSON."""
    rows = {r.pod: r for r in merge_rows(fleet())}
    assert rows["train"].at_risk  # over-hard on GPU 0, under pressure
    assert not rows["big"].at_risk  # over-soft, on GPU 1: no pressure
    assert not rows["serve"].at_risk  # under its quota, on GPU 0
    table = render_top(list(rows.values()), Output.table)
    [train] = [line for line in table.splitlines() if "train" in line]
    assert "over-hard (GPU under pressure)" in train
    assert sum("under pressure" in line for line in table.splitlines()) == 1
    assert json.loads(render_top([rows["train"]], Output.json))["items"][0]["at_risk"] is True


def test_the_tables_name_an_agent_without_an_answer() -> None:
    """The AGENT column is in `-o wide` only: the plain tables name the silent agent in its STATE."""
    said = "no answer from vramguard/vramguard-node-d: 503 Service Unavailable: connection refused"
    for table in (render_top(merge_rows(fleet()), Output.table), render_nodes(merge_nodes(fleet()), Output.table)):
        [silent] = [line for line in table.splitlines() if line.startswith("node-d")]
        assert silent.endswith(said) or f"{said}  " in silent, table
    items = json.loads(render_top(merge_rows(fleet()), Output.json))["items"]
    [failed] = [item for item in items if item["error"]]
    assert failed["state"].startswith("no answer: ") and failed["agent"] == "vramguard/vramguard-node-d"


def test_table_columns() -> None:
    """The top, wide and nodes tables have their columns in order, and one line per row."""
    table = render_top(sort_rows(merge_rows(fleet())), Output.table)
    header, *lines = table.splitlines()
    assert header.split() == ["NODE", "GPU", "NAMESPACE", "POD", "CONTAINER", "USED", "QUOTA", "%", "STATE", "HELD-BY"]
    assert len(lines) == 7
    wide = render_top(merge_rows(fleet()), Output.wide).splitlines()[0].split()
    assert wide[-6:] == ["QUOTA-SOURCE", "CLAIM", "PIDS", "AGENT", "VERSION", "COMMAND"]
    assert render_nodes(merge_nodes(fleet()), Output.table).splitlines()[0].split() == [
        "NODE",
        "GPU",
        "NAME",
        "TOTAL",
        "USED",
        "UNDER-QUOTA",
        "UNATTRIBUTED",
        "FREE",
        "LIMITS",
        "STATE",
    ]


def test_tenant_text_is_escaped_in_the_table_and_exact_in_json() -> None:
    """Tenant text is escaped in the tables and carried exactly in JSON."""
    hostile = "evil\x1b[2J\u202e"
    rows = merge_rows([answer("node-h", [gpu_doc("0")], [container_doc("t", hostile, GiB, None, "unmanaged")])])
    assert "\x1b" not in render_top(rows, Output.wide)
    assert "evil\\x1b[2J\\u202e" in render_top(rows, Output.table)
    assert json.loads(render_top(rows, Output.json))["items"][0]["pod"] == hostile


@pytest.mark.parametrize("output", [Output.json, Output.yaml])
def test_machine_output_round_trips(output: Output) -> None:
    """JSON and YAML output of top and nodes load back to the rows as dictionaries."""
    rows = sort_rows(merge_rows(fleet()))
    load = json.loads if output is Output.json else yaml.safe_load
    top = load(render_top(rows, output))
    assert top == {"kind": "VramguardTop", "items": [row_dict(r) for r in rows]}
    nodes = load(render_nodes(merge_nodes(fleet()), output))
    assert nodes["kind"] == "VramguardNodes" and len(nodes["items"]) == 5


@pytest.mark.parametrize(
    ("pod", "colour", "sgr"),
    [
        pytest.param("train", True, "\x1b[1;31m", id="over-red"),
        pytest.param("edge", True, "\x1b[33m", id="near-yellow"),
        pytest.param("serve", True, "\x1b[32m", id="fine-green"),
        pytest.param("train", False, None, id="plain"),
    ],
)
def test_state_colour_only_when_asked(pod: str, colour: bool, sgr: str | None) -> None:
    """The state is coloured by its level only when asked, and the columns after it stay aligned."""
    rows = [r for r in merge_rows(fleet()) if r.pod == pod]
    table = render_top(rows, Output.table, colour=colour)
    if sgr is None:
        assert "\x1b" not in table
    else:
        assert f"{sgr}{rows[0].state}" in table.splitlines()[1]
        # The coloured column stays aligned: the HELD-BY column starts where the header says.
        header, line = table.splitlines()
        plain = line.replace(sgr, "").replace("\x1b[0m", "")
        assert plain.index(rows[0].held_by, header.index("STATE")) == header.index("HELD-BY")


def test_a_command_is_cut_to_the_width_vramguard_top_cuts_it_to() -> None:
    """`-o wide` shows a command escaped and cut to the shared TABLE_COMMAND_CHARS, as `vramguard top` does."""
    row = Row("node-a", "0", "ml", "p", "main", GiB, 2 * GiB, 50.0, "ok", "agent", command="python " + "x" * 5000)
    header, line = render_top([row], Output.wide).splitlines()
    cell = line[header.index("COMMAND") :]
    assert len(cell) == TABLE_COMMAND_CHARS and cell.endswith("[cut: 5007 characters]")
