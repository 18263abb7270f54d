"""`vramguard top` over a simulated node: usage, quota and state, with hostile names shown escaped."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from vramguard.core.quantity import GiB
from vramguard_testbed.simnode import SimulatedNode


def raw_controls(text: str) -> set[str]:
    """The characters a terminal would interpret (controls, bidi and other format characters), newlines aside."""
    return {c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}


def test_top_json_shows_usage_quota_and_state(sim_node: SimulatedNode) -> None:
    """`top --once --json` lists each container's GPU, PIDs, usage, quota and state, and unattributed ones."""
    ok = sim_node.add_pod("ok", "ml", containers={"main": {"vramguard.io/vram": "4Gi"}})
    over = sim_node.add_pod("over", "ml", containers={"main": {"tencent.com/vcuda-memory": "8"}})  # 2Gi
    a = sim_node.spawn(ok, "main", 1 * GiB)
    b = sim_node.spawn(over, "main", 3 * GiB)
    h = sim_node.spawn_host(1 * GiB)
    result = sim_node.run_vramguard("top", "--once", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kind"] == "VramguardStatus" and doc["agent"]["dry_run"] is True, "top's own agent changes nothing"
    assert [g["gpu"] for g in doc["gpus"]] == ["0"] and doc["truncated"] == 0
    rows = {r["pod"]: r for r in doc["containers"]}
    assert rows["ok"]["pids"] == [a.pid] and rows["ok"]["state"] == "ok" and rows["ok"]["quota_bytes"] == 4 * GiB
    assert rows["over"]["pids"] == [b.pid] and rows["over"]["state"] == "over-hard"
    assert rows["over"]["percent"] == 150.0
    assert rows["ok"]["quota_source"] == "limits[vramguard.io/vram]" and rows["-"]["quota_source"] == ""
    assert rows["ok"]["held_by"] == "agent" and rows["-"]["held_by"] == "-"  # a driver without limits support
    assert rows["-"]["pids"] == [h.pid] and rows["-"]["state"].startswith("unattributed")
    assert b.alive(), "top changes nothing"
    # Whose process, running what: the user and the command line, as /proc has them.
    command = Path(f"/proc/{b.pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()
    assert rows["over"]["processes"] == [{"pid": b.pid, "user": "root", "command": command[:80]}]

    table = sim_node.run_vramguard("top", "--once").stdout.splitlines()
    assert table[0].split() == [
        "GPU", "NAMESPACE", "POD", "CONTAINER", "USED", "QUOTA", "%", "STATE", "HELD-BY", "PID", "USER", "COMMAND"
    ]  # fmt: skip
    over_line = next(line for line in table if line.split()[2:4] == ["over", "main"])
    assert over_line.split()[7:11] == ["over-hard", "agent", str(b.pid), "root"]
    assert over_line.rstrip().endswith(command[:80])


@pytest.mark.cgroups
def test_top_shows_hostile_names_and_command_lines_escaped_and_json_exact(sim_node: SimulatedNode) -> None:
    """A pods file can name a pod, namespace and container anything, and a tenant writes its command line: the
    table shows their ESC, BEL, bidi, return, tab and newline characters escaped, `--json` carries them exactly."""
    hostile = "x\x1b[2J\x07\u202eexe\u200f\r\t\n"
    pod = sim_node.add_pod(
        f"evil{hostile}", f"ml{hostile}", containers={f"main{hostile}": {"vramguard.io/vram": "1Gi"}}
    )
    # The hostile text early in the command, within the table's 80 characters once escaped; quoted, so inert.
    script = f": '{hostile}'; exec 3<\"$1\"; while :; do sleep 60; done"
    argv = ["/bin/sh", "-c", script, "sh", str(sim_node.device_path)]
    proc = sim_node.spawn_command(pod, f"main{hostile}", argv)
    proc.used_bytes = 2 * GiB
    sim_node.processes.append(proc)
    sim_node.sync()

    rows = json.loads(sim_node.run_vramguard("top", "--once", "--json").stdout)["containers"]
    (row,) = [r for r in rows if r["pids"] == [proc.pid]]
    assert (row["pod"], row["namespace"], row["container"]) == (f"evil{hostile}", f"ml{hostile}", f"main{hostile}")
    assert row["processes"][0]["command"] == " ".join(argv)

    table = sim_node.run_vramguard("top", "--once").stdout
    assert raw_controls(table) == set(), repr(table)
    escaped = "x\\x1b[2J\\x07\\u202eexe\\u200f\\x0d\\x09\\x0a"
    assert table.count(escaped) == 4, "pod, namespace, container, command"
    assert len(table.splitlines()) == len(rows) + 1, "one line per row: no newline of a tenant's starts one"
    proc.popen.kill()
