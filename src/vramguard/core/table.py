"""The status tables, as `vramguard top` (one node, from its own scan) and `kubectl vramguard` (the agents' /status
documents) print them: one layout, one set of cells and one width for a command, so the two read alike.

Every cell is tenant text until shown otherwise: escaped (`text.printable`), never raw on a terminal, and the
columns are as wide as the escaped text. Pure: the caller says whether to colour.
"""

from __future__ import annotations

from collections.abc import Sequence

from vramguard.core.text import cut, format_bytes, printable

# The columns of a container's row on a GPU, in both tables (the plugin's first names the node).
CONTAINER_COLUMNS = ("GPU", "NAMESPACE", "POD", "CONTAINER", "USED", "QUOTA", "%", "STATE", "HELD-BY")
# A command's escaped text is cut to this in a table, so that a row keeps to a screen or so.
TABLE_COMMAND_CHARS = 80
RESET = "\x1b[0m"  # ANSI SGR: ends a cell's colour


def bytes_cell(n: int | None) -> str:
    """Bytes as people read them, "-" where there are none to show (no quota, no answer)."""
    return format_bytes(n) if n is not None else "-"


def percent_cell(percent: float | None) -> str:
    return f"{percent:.0f}" if percent is not None else "-"


def command_cell(command: str) -> str:
    """A command line, escaped and cut to `TABLE_COMMAND_CHARS` (marked where cut)."""
    return cut(printable(command), TABLE_COMMAND_CHARS)


def layout(
    header: Sequence[str],
    lines: Sequence[Sequence[str]],
    colours: Sequence[str] = (),
    coloured: str = "STATE",
) -> str:
    """The lines under the header, each cell escaped, each column padded to its widest escaped cell, two spaces
    between columns and no trailing space. With `colours` (an ANSI SGR prefix for each line, "" for none), each
    line's `coloured` cell is coloured, its padding not."""
    cells = [[printable(c) for c in header], *([printable(c) for c in line] for line in lines)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    at = list(header).index(coloured) if colours else -1
    out: list[str] = []
    for n, line in enumerate(cells):
        padded = [c.ljust(w) for c, w in zip(line, widths, strict=True)]
        if n > 0 and colours and colours[n - 1]:
            padded[at] = f"{colours[n - 1]}{line[at]}{RESET}" + " " * (widths[at] - len(line[at]))
        out.append("  ".join(padded).rstrip())
    return "\n".join(out)
