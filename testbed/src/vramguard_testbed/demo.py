"""`vramguard-demo` (`scripts/demo.sh`): the agent at work on a simulated GPU node, narrated.

One simulated 24 GiB GPU, three GPU processes — a trainer with an 8Gi quota, a notebook with a 4Gi pod-wide
quota, and a host process outside any pod — all real processes in real kubelet-shaped cgroups. The agent runs as
`vramguard run --mode kill`; the trainer then grows past its quota. The demo prints what the agent saw (`vramguard
top`), what it did (its own log lines), and checks the outcome: the trainer dead, everyone else untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import typer

from vramguard.model import GiB
from vramguard_testbed.cgroups import cgroups_unavailable
from vramguard_testbed.simnode import SimulatedNode, metric_value, wait_for


def _say(text: str = "") -> None:
    print(text, flush=True)


def _relay(stream: IO[str], seen: list[dict[str, object]]) -> None:
    """Print the agent's actions and events as they happen; keep every log line for the checks."""
    for line in stream:
        try:
            entry = json.loads(line)
        except ValueError:
            _say(f"  agent | {line.rstrip()}")
            continue
        seen.append(entry)
        if entry.get("event") in ("action", "quota_invalid", "gpu_unhealthy", "nvml_unavailable"):
            fields = " ".join(f"{k}={entry[k]}" for k in ("action", "reason", "result", "pod", "pids") if k in entry)
            _say(f"  agent | {entry['event']:<7} {fields}")
            if "message" in entry:
                _say(f"        |         {entry['message']}")


def run_demo(poll_interval_s: float = 0.5, keep: bool = False) -> int:
    if os.geteuid() != 0 or (reason := cgroups_unavailable(version=2)) is not None:
        why = "it needs root" if os.geteuid() != 0 else reason
        _say(f"vramguard-demo creates real cgroups under /sys/fs/cgroup and {why}: run it as root.")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="vramguard-demo-"))
    _say("vramguard-demo: a simulated GPU node (test NVML library, real processes in real cgroups)\n")
    try:
        with SimulatedNode(workdir, gpu_total_bytes=24 * GiB) as node:
            trainer = node.add_pod("trainer", "ml", containers={"pytorch": {"vramguard.io/vram": "8Gi"}})
            notebook = node.add_pod("notebook", "ml", annotations={"vramguard.io/vram-limit": "4Gi"})
            t = node.spawn(trainer, "pytorch", 6 * GiB, children=1)  # a DataLoader-style child shares the GPU
            n = node.spawn(notebook, "main", 3 * GiB)
            h = node.spawn_host(2 * GiB)
            _say(f"1. Three GPU processes on GPU 0 (24GiB). Pods from {node.pods_path}:")
            _say("   ml/trainer   container pytorch, resources.limits vramguard.io/vram: 8Gi")
            _say("   ml/notebook  annotation vramguard.io/vram-limit: 4Gi")
            _say("   and a process outside any pod (a node daemon)\n")
            _say("   vramguard top --once:")
            _say(_indent(node.run_vramguard("top", "--once").stdout))

            _say(f"2. Start the agent: vramguard run --mode kill --poll-interval {poll_interval_s}")
            seen: list[dict[str, object]] = []
            agent = node.start_agent(
                "--mode", "kill", "--poll-interval", str(poll_interval_s), stderr=subprocess.PIPE, text=True
            )
            assert agent.stderr is not None
            relay = threading.Thread(target=_relay, args=(agent.stderr, seen), daemon=True)
            relay.start()
            node.wait_ready()
            _say(f"   ready: {node.http_get('/readyz')[1].strip()}; metrics on :{node.metrics_port}\n")

            _say("3. The trainer allocates 11GiB: 3GiB over its quota.")
            crossed = time.monotonic()
            node.set_usage(t, 11 * GiB)
            killed = wait_for(lambda: not t.alive(), timeout_s=10 * poll_interval_s + 5)
            reaction_ms = (time.monotonic() - crossed) * 1000
            time.sleep(poll_interval_s)  # let one more scan see the freed memory
            _say("")
            _say("4. After:")
            _say(_indent(node.run_vramguard("top", "--once").stdout))
            metrics = node.http_get("/metrics")[1]
            node.stop_agents()
            relay.join(timeout=5)

            checks = [
                (killed, f"trainer (PID {t.pid}) killed {reaction_ms:.0f} ms after crossing its quota"),
                (
                    all(not _exists(c) for c in t.children),
                    f"its forked child (PID {', '.join(map(str, t.children))}) holding the GPU killed too",
                ),
                (n.alive(), f"notebook (PID {n.pid}) within its quota, untouched"),
                (h.alive(), f"host process (PID {h.pid}) outside any pod, untouched"),
                (
                    metric_value(metrics, "vramguard_actions_total", {"action": "kill", "result": "ok"}) == 1.0,
                    'vramguard_actions_total{action="kill",result="ok"} 1',
                ),
            ]
            _say("5. Checks:")
            for ok, text in checks:
                _say(f"   [{'ok' if ok else 'FAILED'}] {text}")
            return 0 if all(ok for ok, _ in checks) else 1
    finally:
        if keep:
            _say(f"\nFiles kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _indent(text: str) -> str:
    return "\n".join("   " + line for line in text.rstrip().splitlines()) + "\n"


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cli(
    poll_interval: float = typer.Option(0.5, "--poll-interval", min=0.05, help="The agent's seconds between scans."),
    keep: bool = typer.Option(False, "--keep", help="Leave the simulated node's files in place."),
) -> None:
    """Show the agent at work on a simulated GPU node: test NVML library + real processes in real cgroups."""
    raise typer.Exit(run_demo(poll_interval_s=poll_interval, keep=keep))


def main() -> None:
    typer.run(_cli)
