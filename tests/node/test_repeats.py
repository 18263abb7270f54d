"""The kill memory's file over the real node: a FIFO at kills.json is refused at once, never read, and what a file
says was killed is checked against real processes in real container cgroups. Its other rules are in
tests/unit/node/test_repeats.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from cgroup_fixtures import CgroupsFactory
from vramguard.core.actions import KillRecord
from vramguard.core.process import ProcessRef
from vramguard.node.procfs import read_stat
from vramguard.node.repeats import STILL_RUNNING, KillFile

BOOT = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
NOW = 1000.0


def test_a_fifo_neither_blocks_nor_is_read(tmp_path: Path) -> None:
    """Whatever sits at kills.json, load returns at once with nothing, and says why in one log line."""
    boot = tmp_path / "boot_id"
    boot.write_text(BOOT + "\n")
    memory = KillFile(str(tmp_path / "state"), boot_id_path=str(boot))
    Path(memory.path).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(memory.path)
    result: list[tuple[Mapping[str, KillRecord], list[MutableMapping[str, Any]]]] = []

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
    assert [(e["event"], e["problems"]) for e in logs] == [("kill_memory_refused", ["not a regular file"])]


def _ref(pid: int) -> ProcessRef:
    found = read_stat(pid)
    assert found is not None
    return ProcessRef(pid, found[1])


def test_kills_are_checked_against_real_processes(tmp_path: Path, make_cgroups: CgroupsFactory) -> None:
    """Over the real /proc and this boot's ID: a kill whose process really ended is restored; one naming a process
    that still runs is refused (it was never killed); one in a container with no process left is set aside."""
    pod = make_cgroups().pod()
    trainer, liar, ended = pod.container(), pod.container(), pod.container()
    trainer.spawn(["sleep", "600"])  # the container's first process: it lives as long as the container
    worker = trainer.spawn(["sleep", "600"])
    killed = _ref(worker.pid)
    worker.kill()
    worker.wait()
    running = _ref(liar.spawn(["sleep", "600"]).pid)
    at = time.monotonic() - 5
    memory = KillFile(str(tmp_path / "state"))
    memory.save(
        {
            trainer.container_id: KillRecord(at, (killed,)),
            liar.container_id: KillRecord(at, (running,)),
            ended.container_id: KillRecord(at, (killed,)),
        }
    )
    with capture_logs() as logs:
        kills = memory.load(time.monotonic())
    assert dict(kills) == {trainer.container_id: KillRecord(at, (killed,), restored=True)}
    assert [(e["event"], e["containers"]) for e in logs] == [
        ("kill_memory_restored", [trainer.container_id[:12]]),
        ("kill_memory_refused", [liar.container_id[:12]]),
    ]
    assert (logs[0]["gone"], logs[1]["problems"]) == (1, (STILL_RUNNING,))
