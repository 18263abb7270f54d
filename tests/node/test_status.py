"""The agent's /status on a simulated node: its pods' rows, the same as `vramguard top --once --json` prints."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from vramguard import __version__
from vramguard.cli.driver import LIMITS_UNASKED
from vramguard.core.quantity import GiB
from vramguard.nvml import binding_version
from vramguard_testbed.simnode import SimulatedNode
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 0.25


def test_status_answers_the_nodes_rows_as_top_prints_them(sim_node: SimulatedNode) -> None:
    ok = sim_node.add_pod("ok", "ml", containers={"main": {"vramguard.io/vram": "4Gi"}})
    over = sim_node.add_pod("over", "ml", annotations={"vramguard.io/vram-limit": "2Gi"})
    a = sim_node.spawn(ok, "main", 1 * GiB)
    b = sim_node.spawn(over, "main", 3 * GiB)
    h = sim_node.spawn_host(1 * GiB)
    sim_node.start_agent("--mode", "warn", "--poll-interval", str(POLL_S))
    sim_node.wait_ready()

    with urllib.request.urlopen(f"http://127.0.0.1:{sim_node.metrics_port}/status", timeout=5) as r:
        assert (r.status, r.headers["Content-Type"]) == (200, "application/json")
        status = json.loads(r.read())
    assert (status["kind"], status["schema"], status["truncated"]) == ("VramguardStatus", 1, 0)
    agent = status["agent"]
    assert (agent["version"], agent["node"], agent["mode"], agent["dry_run"]) == (
        __version__,
        sim_node.node_name,
        "warn",
        False,
    )
    assert agent["poll_interval_s"] == POLL_S
    assert 0.0 <= agent["scan_age_s"] < 30.0, "a scan completed before /readyz said ready"
    # The NVIDIA side, as the test NVML says it (an R550 driver); a warn-mode agent never asks about limits.
    assert (agent["nvidia_ml_py"], agent["driver_version"], agent["nvml_version"]) == (
        binding_version(),
        "550.54.15",
        "12.550.54.15",
    )
    assert (agent["driver_limits_possible"], agent["driver_limits_reason"]) == (None, LIMITS_UNASKED)
    rows = {r["pod"]: r for r in status["containers"]}
    assert rows["ok"]["pids"] == [a.pid] and rows["ok"]["state"] == "ok"
    assert rows["ok"]["quota_source"] == "limits[vramguard.io/vram]" and rows["ok"]["held_by"] == "agent"
    assert rows["over"]["pids"] == [b.pid] and rows["over"]["state"] == "over-hard"
    assert rows["over"]["quota_source"] == "annotation vramguard.io/vram-limit"
    assert rows["-"]["pids"] == [h.pid] and rows["-"]["state"].startswith("unattributed")
    (gpu,) = status["gpus"]
    assert (gpu["gpu"], gpu["healthy"], gpu["limits"], gpu["used_bytes"]) == ("0", True, "agent", 5 * GiB)
    assert b.alive(), "warn mode"

    # `top` on the same node: the same GPUs and rows (the node stands still), its own agent's facts; /status names
    # each process's program, top (run by someone on the node) shows its whole command line.
    top = json.loads(sim_node.run_vramguard("top", "--once", "--json").stdout)
    commands = {p["pid"]: p["command"] for r in top["containers"] for p in r["processes"]}
    programs = {p["pid"]: p["command"] for r in status["containers"] for p in r["processes"]}
    assert programs.keys() == commands.keys()
    for pid, program in programs.items():
        assert program.startswith("[") and program[1:-1] in commands[pid], (program, commands[pid])

    def without_commands(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**r, "processes": [{**p, "command": ""} for p in r["processes"]]} for r in rows]

    assert top["gpus"] == status["gpus"]
    assert without_commands(top["containers"]) == without_commands(status["containers"])
    assert top["agent"]["dry_run"] is True and top["agent"]["node"] == sim_node.node_name

    # The age is the answer's: it grows between scans, and a later scan starts it again.
    ages: list[float] = []

    def a_newer_scan() -> bool:
        ages.append(json.loads(sim_node.http_get("/status")[1])["agent"]["scan_age_s"])
        return len(ages) > 1 and ages[-1] < ages[-2]

    wait_until(a_newer_scan, 10, what="a newer scan's age on /status")
