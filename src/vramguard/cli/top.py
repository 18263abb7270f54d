"""`vramguard top`: the rows of a scan (`agent/report.py`) as a table (`core/table.py`, the layout
`kubectl vramguard top` prints too). Tenant text is shown escaped, never raw on a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

from vramguard.agent.report import TopRow
from vramguard.core.table import CONTAINER_COLUMNS, bytes_cell, command_cell, layout, percent_cell
from vramguard.node.describe import ProcessDetail


def render_table(rows: Sequence[TopRow]) -> str:
    """One line per container and GPU; a container's further processes on lines of their own below it."""
    header: tuple[str, ...] = (*CONTAINER_COLUMNS, "CLAIM", "PID", "USER", "COMMAND")
    lines: list[tuple[str, ...]] = []
    for r in rows:
        first, *rest = r.processes or (ProcessDetail(0, "", ""),)
        lines.append(
            (
                r.gpu,
                r.namespace,
                r.pod,
                r.container,
                bytes_cell(r.used_bytes),
                bytes_cell(r.quota_bytes),
                percent_cell(r.percent),
                r.state,
                r.held_by,
                r.claim,
                str(first.pid) if r.processes else "-",
                first.user,
                command_cell(first.command),
            )
        )
        lines.extend(
            ("", "", "", "", "", "", "", "", "", "", str(p.pid), p.user, command_cell(p.command)) for p in rest
        )
    if not rows:
        lines.append(("-", "", "", "", "", "", "", "no GPU processes", "", "", "", "", ""))
    if not any(r.claim for r in rows):  # the CLAIM column only where DRA claims give quotas
        at = header.index("CLAIM")
        header = header[:at] + header[at + 1 :]
        lines = [line[:at] + line[at + 1 :] for line in lines]
    return layout(header, lines)
