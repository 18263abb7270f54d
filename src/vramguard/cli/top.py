"""`vramguard top`: the rows of a scan (`agent/report.py`) as a table. Tenant text is shown escaped
(`text.printable`), never raw on a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

from vramguard.agent.report import TopRow
from vramguard.core.text import cut, format_bytes, printable
from vramguard.node.describe import ProcessDetail

TABLE_COMMAND_CHARS = 80  # a command's escaped text is cut to this in the table, to keep a row on a screen


def render_table(rows: Sequence[TopRow]) -> str:
    """One line per container and GPU; a container's further processes on lines of their own below it."""
    header: tuple[str, ...] = (
        "GPU",
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "USED",
        "QUOTA",
        "%",
        "STATE",
        "HELD-BY",
        "CLAIM",
        "PID",
        "USER",
        "COMMAND",
    )
    lines: list[tuple[str, ...]] = [header]
    for r in rows:
        first, *rest = r.processes or (ProcessDetail(0, "", ""),)
        lines.append(
            (
                r.gpu,
                r.namespace,
                r.pod,
                r.container,
                format_bytes(r.used_bytes),
                format_bytes(r.quota_bytes) if r.quota_bytes is not None else "-",
                f"{r.percent:.0f}" if r.percent is not None else "-",
                r.state,
                r.held_by,
                r.claim,
                str(first.pid) if r.processes else "-",
                first.user,
                cut(printable(first.command), TABLE_COMMAND_CHARS),
            )
        )
        lines.extend(
            ("", "", "", "", "", "", "", "", "", "", str(p.pid), p.user, cut(printable(p.command), TABLE_COMMAND_CHARS))
            for p in rest
        )
    if not rows:
        lines.append(("-", "", "", "", "", "", "", "no GPU processes", "", "", "", "", ""))
    if not any(r.claim for r in rows):  # the CLAIM column only where DRA claims give quotas
        at = header.index("CLAIM")
        lines = [line[:at] + line[at + 1 :] for line in lines]
        header = lines[0]
    # Tenant text: nothing raw on a terminal; the widths are those of the escaped text (a command's is already).
    lines = [tuple(printable(cell) for cell in line) for line in lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)
