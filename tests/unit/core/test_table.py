"""The status tables' layout, shared by `vramguard top` and `kubectl vramguard`: escaped cells, columns as wide as
their escaped text, colour outside the padding, a command cut to one width."""

from __future__ import annotations

import pytest

from vramguard.core.quantity import GiB
from vramguard.core.table import RESET, TABLE_COMMAND_CHARS, bytes_cell, command_cell, layout, percent_cell


def test_columns_are_as_wide_as_their_widest_cell_two_spaces_apart() -> None:
    """Every column padded to its widest cell (the header's included), no trailing space on a line."""
    table = layout(("GPU", "POD", "STATE"), [("0", "trainer", "ok"), ("10", "a", "over-hard")])
    assert table.splitlines() == [
        "GPU  POD      STATE",
        "0    trainer  ok",
        "10   a        over-hard",
    ]


def test_tenant_text_is_escaped_and_measured_escaped() -> None:
    """A control character in a cell is shown escaped, and the column is as wide as the escaped text."""
    header, line = layout(("POD", "STATE"), [("\x1b[2J", "ok")]).splitlines()
    assert line == "\\x1b[2J  ok" and header.index("STATE") == line.index("ok")


def test_colour_wraps_the_cell_and_leaves_the_padding_outside() -> None:
    """Each line's coloured cell is wrapped in its colour, padded after the reset; "" leaves a line plain, and the
    header is never coloured."""
    lines = layout(("STATE", "HELD-BY"), [("ok", "agent"), ("over-hard", "driver")], ["\x1b[32m", ""]).splitlines()
    assert lines == ["STATE      HELD-BY", f"\x1b[32mok{RESET}         agent", "over-hard  driver"]


@pytest.mark.parametrize(
    ("cell", "value", "shown"),
    [
        pytest.param(bytes_cell, 3 * GiB, "3.0GiB", id="bytes"),
        pytest.param(bytes_cell, None, "-", id="no-bytes-is-a-dash"),
        pytest.param(percent_cell, 74.6, "75", id="percent-rounded"),
        pytest.param(percent_cell, None, "-", id="no-percent-is-a-dash"),
    ],
)
def test_cells(cell: object, value: object, shown: str) -> None:
    """Numbers as people read them, a dash where there is none."""
    assert cell(value) == shown  # type: ignore[operator]


def test_a_command_is_escaped_and_cut_to_one_width() -> None:
    """A command line keeps to TABLE_COMMAND_CHARS of escaped text, marked with its whole length where cut."""
    assert command_cell("python train.py") == "python train.py"
    long = command_cell("python " + "\x1b" * 500)
    assert len(long) == TABLE_COMMAND_CHARS and long.endswith("characters]") and "\x1b" not in long
