"""`vramguard top`'s table and rows: one line a process, tenant text escaped, a command cut to a screen."""

from __future__ import annotations

import unicodedata

import pytest

from unit.agent.test_report import CLAIM_ROW, HOSTILE_ROW, TRAINER_ROW
from vramguard.agent.report import TopRow
from vramguard.cli.top import render_table
from vramguard.core.quantity import GiB
from vramguard.core.table import TABLE_COMMAND_CHARS
from vramguard.node.describe import ProcessDetail


def raw_controls(text: str) -> set[str]:
    """The characters a terminal would interpret (controls, bidi and other format characters) in `text`."""
    return {c for line in text.split("\n") for c in line if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}


def command_row(command: str) -> TopRow:
    """A row of one process whose command line is `command`."""
    return TopRow("0", "ml", "p", "main", (ProcessDetail(7, "u", command),), GiB, 2 * GiB, "ok")


def test_table_lists_each_process_of_a_container() -> None:
    """The container's line carries its first process; the others follow on lines of their own."""
    header, first, second = render_table([TRAINER_ROW]).splitlines()
    assert header.split()[-3:] == ["PID", "USER", "COMMAND"]
    assert first.split() == [
        "0",
        "ml",
        "trainer",
        "main",
        "3.0GiB",
        "4.0GiB",
        "75",
        "ok",
        "driver",
        "10",
        "alice",
        "python",
        "train.py",
    ]
    assert second.split() == ["11", "alice", "python", "loader.py"]
    assert second.index("11") == first.index(" 10 ") + 1, "further processes line up under PID"


def test_a_claim_column_only_where_dra_claims_give_quotas() -> None:
    """Rows whose quota is a DRA share name its claim; without any, the table has no CLAIM column."""
    other = TopRow("0", "ml", "batch", "main", (ProcessDetail(8, "eve", "python batch.py"),), GiB, 4 * GiB, "ok")
    header, *_ = render_table([CLAIM_ROW, other]).splitlines()
    assert header.split()[8:10] == ["HELD-BY", "CLAIM"]
    lines = render_table([CLAIM_ROW, other]).splitlines()
    assert "small-gpu0-x7k2" in next(line for line in lines if " small " in line)
    assert "CLAIM" not in render_table([other]).splitlines()[0]


def test_hostile_tenant_text_is_escaped_in_the_table() -> None:
    """Namespace, pod, container, user, command, state and claim: no raw control or bidi character in the table
    (one line per row, columns aligned)."""
    table = render_table([HOSTILE_ROW])
    assert raw_controls(table) == set()
    header, line = table.splitlines()
    assert "\\x1b[2J" in line and "\\u202e" in line and "\\x0d\\x09\\x0aforged line" in line
    assert line.index("1.0GiB") == header.index("USED"), "escaped cells keep the columns aligned"
    assert line.index("7 ") == header.index("PID"), "widths are those of the escaped text"


@pytest.mark.parametrize(
    "command",
    [
        pytest.param("python " + "x" * 5000, id="long-command"),
        pytest.param("\x1b" * 100, id="control-characters-counted-escaped"),
        pytest.param("\u202e" * 100, id="bidi-characters-counted-escaped"),
    ],
)
def test_the_table_shows_at_most_a_screen_of_a_command(command: str) -> None:
    """The COMMAND cell is at most TABLE_COMMAND_CHARS of the escaped command, marked when cut, nothing raw."""
    row = command_row(command)
    header, line = render_table([row]).splitlines()
    cell = line[header.index("COMMAND") :]
    assert len(cell) == TABLE_COMMAND_CHARS and cell.endswith(" characters]") and raw_controls(cell) == set()


def test_a_long_command_is_shorter_in_the_table() -> None:
    """A command line is tenant-sized: the table shows a screen's worth, marked with the whole length."""
    command = "python " + "x" * 5000
    row = command_row(command)
    shown = render_table([row]).splitlines()[1].rsplit(" python ", 1)[1]
    assert len("python " + shown) == 80 and shown.endswith("[cut: 5007 characters]")


def test_an_orphans_processes_show_under_the_pod_that_is_gone() -> None:
    """The processes of a pod that is gone are a row of their own under the pod's namespace and name (where the
    agent saw it; else its UID), with no container or quota, its state saying so."""
    orphan = TopRow("0", "ml", "old-trainer", "-", (ProcessDetail(12, "alice", "python train.py"),), 5 * GiB, None,
                    "unattributed: orphaned: its pod is gone", reason="orphaned")  # fmt: skip
    header, line = render_table([orphan]).splitlines()
    assert line.split()[:7] == ["0", "ml", "old-trainer", "-", "5.0GiB", "-", "-"]
    assert line[header.index("STATE") :].startswith("unattributed: orphaned: its pod is gone ")
    assert line[header.index("PID") :].split() == ["12", "alice", "python", "train.py"]
