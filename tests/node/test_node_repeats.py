"""The kill memory's file against what blocks a reader: a FIFO at kills.json is refused at once, never read. Its
other rules are in tests/unit/node/test_repeats.py."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from vramguard.node.repeats import KillFile

BOOT = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
NOW = 1000.0


def test_a_fifo_neither_blocks_nor_is_read(tmp_path: Path) -> None:
    """Whatever sits at kills.json, load returns at once with nothing, and says why in one log line."""
    boot = tmp_path / "boot_id"
    boot.write_text(BOOT + "\n")
    memory = KillFile(str(tmp_path / "state"), boot_id_path=str(boot))
    Path(memory.path).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(memory.path)
    result: list[tuple[Mapping[str, float], list[MutableMapping[str, Any]]]] = []

    def load() -> None:
        with capture_logs() as logs:
            result.append((memory.load(NOW), logs))

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # release a reader stuck on the FIFO, so that a failure ends
        os.close(os.open(memory.path, os.O_WRONLY | os.O_NONBLOCK))
    assert not reader.is_alive(), "the load blocked on the FIFO"
    ((kills, logs),) = result
    assert kills == {}
    assert [(e["event"], e["problems"]) for e in logs] == [("kill_memory_junk", ["not a regular file"])]
