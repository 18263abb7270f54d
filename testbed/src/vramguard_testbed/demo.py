"""`vramguard-demo` (`scripts/demo.sh`): the agent at work on a simulated GPU node, narrated.

One simulated 24 GiB GPU, three GPU processes — a trainer with an 8Gi quota, a notebook with a 4Gi pod-wide
quota, and a host process outside any pod — all real processes in real kubelet-shaped cgroups. The agent runs as
`vramguard run --mode kill`; the trainer then grows past its quota. The demo prints what the agent saw (`vramguard
top`), what it did (its own log lines), and checks the outcome: the trainer dead, everyone else untouched.

A second scene (`--scene driver-limits`) prevents instead of punishing: on a simulated R615 driver the agent
programs each container's hard limit into the driver, and the trainer's allocation beyond its quota fails in the
trainer alone while its neighbour gets all of its own; on an older driver the same allocation succeeds and the
scene ends with the reactive kill.

A third (`--scene dra`) reads quotas from DRA claims: the scheduler (here, the pods file) gave the trainer a 10Gi
share of GPU 1 and the notebook a 12Gi share of GPU 0; both use 11Gi, and only the trainer is over its share.

A fourth (`--scene amd`) is an AMD node: no NVML at all, one MI300X-shaped GPU seen through the kernel's DRM stats
(a stand-in /sys and fdinfo around the real processes: `drmnode.DrmStandIn`); two pods share it, the one over its
quota is killed, the other is untouched, and `top` shows both by the GPU's PCI slot.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import typer

from vramguard.core.quantity import GiB
from vramguard_testbed.cgroups import cgroups_unavailable
from vramguard_testbed.simnode import SimulatedNode, metric_value
from vramguard_testbed.waiting import WaitTimeout, wait_until


def _say(text: str = "") -> None:
    print(text, flush=True)


def _happens(predicate: Callable[[], object], timeout_s: float, what: str) -> bool:
    """Whether `predicate` comes true within `timeout_s`: a check of the demo, so a timeout is a failed check."""
    try:
        wait_until(predicate, timeout_s, what=what)
    except WaitTimeout:
        return False
    return True


_SHOWN = ("action", "quota_invalid", "gpu_unhealthy", "nvml_unavailable", "driver_limit", "driver_limits_unavailable")
_FIELDS = ("action", "reason", "result", "pod", "container", "gpu", "hard_bytes", "pids")


def _relay(stream: IO[str], seen: list[dict[str, object]]) -> None:
    """Print the agent's actions and events as they happen; keep every log line for the checks."""
    for line in stream:
        try:
            entry = json.loads(line)
        except ValueError:
            _say(f"  agent | {line.rstrip()}")
            continue
        seen.append(entry)
        if entry.get("event") in _SHOWN:
            fields = " ".join(f"{k}={entry[k]}" for k in _FIELDS if k in entry)
            _say(f"  agent | {entry['event']:<7} {fields}")
            if "message" in entry:
                _say(f"        |         {entry['message']}")


def run_demo(poll_interval_s: float = 0.5, keep: bool = False, scene: str = "all") -> int:
    if os.geteuid() != 0 or (reason := cgroups_unavailable(version=2)) is not None:
        why = "it needs root" if os.geteuid() != 0 else reason
        _say(f"vramguard-demo creates real cgroups under /sys/fs/cgroup and {why}: run it as root.")
        return 2
    status = 0
    if scene in ("all", "kill"):
        status = max(status, _kill_scene(poll_interval_s, keep))
    if scene in ("all", "driver-limits"):
        if scene == "all":
            _say("\n" + "-" * 100 + "\n")
        status = max(status, _driver_limits_scene(poll_interval_s, keep))
    if scene in ("all", "dra"):
        if scene == "all":
            _say("\n" + "-" * 100 + "\n")
        status = max(status, _dra_scene(poll_interval_s, keep))
    if scene in ("all", "amd"):
        if scene == "all":
            _say("\n" + "-" * 100 + "\n")
        status = max(status, _amd_scene(poll_interval_s, keep))
    return status


def _kill_scene(poll_interval_s: float, keep: bool) -> int:
    _say("vramguard-demo: a simulated GPU node (test NVML library, real processes in real cgroups)\n")
    with _workdir(keep, "\nFiles kept in ") as workdir, SimulatedNode(workdir, gpu_total_bytes=24 * GiB) as node:
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
        relay = _start_agent(node, poll_interval_s, seen)
        _say(f"   ready: {node.http_get('/readyz')[1].strip()}; metrics on :{node.metrics_port}\n")

        _say("3. The trainer allocates 11GiB: 3GiB over its quota.")
        crossed = time.monotonic()
        node.set_usage(t, 11 * GiB)
        killed = _happens(lambda: not t.alive(), 10 * poll_interval_s + 5, "the trainer killed")
        reaction_ms = (time.monotonic() - crossed) * 1000
        node.wait_scans(1)  # one more scan sees the freed memory
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
        return _checked("5. Checks:", checks)


def _driver_limits_scene(poll_interval_s: float, keep: bool) -> int:
    _say("vramguard-demo, driver limits: a quota held by the driver itself (NVIDIA R615+), then by the agent alone")
    checks = _one_driver(True, poll_interval_s, keep) + _one_driver(False, poll_interval_s, keep)
    return _checked("\nChecks:", checks)


def _one_driver(r615: bool, poll_interval_s: float, keep: bool) -> list[tuple[bool, str]]:
    driver = "an R615 driver (per-cgroup memory limits)" if r615 else "a driver before R615 (no such limits)"
    _say(f"\n{'A' if r615 else 'B'}. A simulated 24GiB GPU on {driver}; two pods with an 8Gi quota each.")
    with (
        _workdir(keep, "   files kept in ") as workdir,
        SimulatedNode(workdir, gpu_total_bytes=24 * GiB, driver_limits=r615) as node,
    ):
        trainer_pod = node.add_pod("trainer", "ml", containers={"pytorch": {"vramguard.io/vram": "8Gi"}})
        notebook_pod = node.add_pod("notebook", "ml", containers={"main": {"vramguard.io/vram": "8Gi"}})
        trainer = node.spawn_allocator(trainer_pod, "pytorch")
        notebook = node.spawn_allocator(notebook_pod, "main")
        seen: list[dict[str, object]] = []
        _say(f"   Start the agent: vramguard run --mode kill --poll-interval {poll_interval_s}")
        relay = _start_agent(node, poll_interval_s, seen)
        if r615:  # the agent has programmed both containers' limits (and said so)
            _happens(lambda: sum(e.get("event") == "driver_limit" for e in seen) >= 2, 10, "two driver_limit events")
        else:
            node.wait_scans(2)
        first = trainer.allocate(0, 6 * GiB)
        _say(f"   trainer allocates 6GiB: {'granted' if first else 'out of memory'}")
        second = trainer.allocate(0, 4 * GiB)
        _say(f"   trainer allocates 4GiB more, 10GiB in all: {'granted' if second else 'OUT OF MEMORY'}")
        neighbour = notebook.allocate(0, 8 * GiB)
        _say(f"   notebook allocates its whole 8GiB: {'granted' if neighbour else 'out of memory'}")
        if r615:
            node.wait_scans(3)  # a few scans: nothing to act on
            checks = [
                (first and not second, "R615: the trainer's allocation beyond its quota failed in the trainer"),
                (neighbour and notebook.process.poll() is None, "R615: the notebook got all of its memory"),
                (trainer.process.poll() is None, "R615: nobody was killed: the driver held the quota"),
            ]
        else:
            killed = _happens(lambda: trainer.process.poll() is not None, 10 * poll_interval_s + 5, "trainer killed")
            node.wait_scans(1)  # one more scan sees the freed memory
            checks = [
                (first and second and killed, "older driver: the allocation went through; the agent killed it"),
                (notebook.process.poll() is None, "older driver: the notebook untouched"),
            ]
        _say("   vramguard top --once:")
        _say(_indent(node.run_vramguard("top", "--once").stdout))
        node.stop_agents()
        relay.join(timeout=5)
        return checks


def _dra_scene(poll_interval_s: float, keep: bool) -> int:
    _say("vramguard-demo, DRA: per-GPU quotas from the memory shares the scheduler put in ResourceClaims\n")
    with (
        _workdir(keep, "\nFiles kept in ") as workdir,
        SimulatedNode(workdir, gpus=2, gpu_total_bytes=24 * GiB) as node,
    ):
        node.publish_shares({"trainer-gpu": ("ml", 1, "10Gi"), "notebook-gpu": ("ml", 0, "12Gi")})
        trainer = node.add_pod("trainer", "ml", containers={"pytorch": {}}, claims={"pytorch": "trainer-gpu"})
        notebook = node.add_pod("notebook", "ml", claims={"main": "notebook-gpu"})
        _say("1. Two 24GiB GPUs, published in a ResourceSlice by their UUIDs; two allocated claims:")
        _say("   ml/trainer-gpu   10Gi share of GPU 1  (used by ml/trainer, container pytorch)")
        _say("   ml/notebook-gpu  12Gi share of GPU 0  (used by ml/notebook, container main)")
        policy = workdir / "policy.yaml"
        policy.write_text('quota_sources: ["claim:gpu.nvidia.com"]\n')
        _say("   policy: quota_sources: [claim:gpu.nvidia.com]\n")
        run = f"vramguard run --mode kill --policy {policy.name} --poll-interval {poll_interval_s}"
        _say(f"2. Start the agent: {run}")
        seen: list[dict[str, object]] = []
        relay = _start_agent(node, poll_interval_s, seen, "--policy", str(policy))
        _say("3. Each allocates 11GiB on its own GPU:")
        t = node.spawn(trainer, "pytorch", 11 * GiB, gpu=1)
        n = node.spawn(notebook, "main", 11 * GiB, gpu=0)
        killed = _happens(lambda: not t.alive(), 10 * poll_interval_s + 5, "the trainer killed")
        node.wait_scans(2)  # a few more scans: nothing else to act on
        _say("\n4. vramguard top --once:")
        _say(_indent(node.run_vramguard("top", "--once", "--policy", str(policy)).stdout))
        node.stop_agents()
        relay.join(timeout=5)
        checks = [
            (killed, "trainer: 11GiB on GPU 1 is over its 10Gi share there: killed"),
            (n.alive(), "notebook: 11GiB on GPU 0 is within its 12Gi share: untouched"),
        ]
        return _checked("5. Checks:", checks)


def _amd_scene(poll_interval_s: float, keep: bool) -> int:
    _say("vramguard-demo, AMD: one MI300X (192GiB) seen through the kernel's DRM memory stats, no NVML\n")
    with _workdir(keep, "\nFiles kept in ") as workdir, SimulatedNode(workdir, amd_gpus=1) as node:
        assert node.drm is not None
        gpu = node.drm.gpus[0]
        trainer = node.add_pod(
            "trainer", "ml", containers={"pytorch": {"amd.com/gpu": "1", "vramguard.io/vram": "64Gi"}}
        )
        notebook = node.add_pod(
            "notebook", "ml", containers={"main": {"amd.com/gpu": "1", "vramguard.io/vram": "96Gi"}}
        )
        t = node.spawn(trainer, "pytorch", 48 * GiB)
        n = node.spawn(notebook, "main", 80 * GiB)
        _say(f"1. An amdgpu GPU at PCI {gpu.slot} ({node.drm.sys_root}/class/drm/{gpu.render_name}); two pods on it:")
        _say("   ml/trainer   amd.com/gpu: 1, vramguard.io/vram: 64Gi   (uses 48GiB)")
        _say("   ml/notebook  amd.com/gpu: 1, vramguard.io/vram: 96Gi   (uses 80GiB)")
        _say(
            "   each process's render-node fd reports its VRAM in fdinfo (drm-resident-vram), as Linux 7.x prints it\n"
        )
        _say("   vramguard top --once:")
        _say(_indent(node.run_vramguard("top", "--once").stdout))
        _say(f"2. Start the agent: vramguard run --mode kill --sys-root {node.drm.sys_root} ...")
        seen: list[dict[str, object]] = []
        relay = _start_agent(node, poll_interval_s, seen)
        _say("3. The trainer allocates 72GiB: 8GiB over its quota.")
        node.set_usage(t, 72 * GiB)
        killed = _happens(lambda: not t.alive(), 10 * poll_interval_s + 5, "the trainer killed")
        node.wait_scans(2)  # a few more scans: nothing else to act on
        _say("\n4. After:")
        _say(_indent(node.run_vramguard("top", "--once").stdout))
        node.stop_agents()
        relay.join(timeout=5)
        reactive = any(e.get("event") == "driver_limits_unavailable" for e in seen)
        checks = [
            (killed, f"trainer: 72GiB on {gpu.slot} is over its 64Gi quota: killed"),
            (n.alive(), "notebook: 80GiB is within its 96Gi quota: untouched"),
            (reactive, "this kernel has no dmem controller: the agent said so and enforced after the fact"),
        ]
        return _checked("5. Checks:", checks)


def _start_agent(
    node: SimulatedNode, poll_interval_s: float, seen: list[dict[str, object]], *args: str
) -> threading.Thread:
    """`vramguard run --mode kill` on the node, its log relayed (and kept in `seen`); returns once it is ready."""
    agent = node.start_agent(
        "--mode", "kill", "--poll-interval", str(poll_interval_s), *args, stderr=subprocess.PIPE, text=True
    )
    assert agent.stderr is not None
    relay = threading.Thread(target=_relay, args=(agent.stderr, seen), daemon=True)
    relay.start()
    node.wait_ready()
    return relay


@contextlib.contextmanager
def _workdir(keep: bool, kept: str) -> Iterator[Path]:
    """A scratch directory for one simulated node, removed afterwards unless `keep` (then its path is printed
    after `kept`)."""
    workdir = Path(tempfile.mkdtemp(prefix="vramguard-demo-"))
    try:
        yield workdir
    finally:
        if keep:
            _say(f"{kept}{workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _checked(heading: str, checks: list[tuple[bool, str]]) -> int:
    """Print the scene's checks; its exit status (0 when every one holds)."""
    _say(heading)
    for ok, text in checks:
        _say(f"   [{'ok' if ok else 'FAILED'}] {text}")
    return 0 if all(ok for ok, _ in checks) else 1


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
    scene: str = typer.Option("all", "--scene", help="kill, driver-limits, dra, amd or all."),
) -> None:
    """Show the agent at work on a simulated GPU node: test NVML library + real processes in real cgroups."""
    if scene not in ("all", "kill", "driver-limits", "dra", "amd"):
        raise typer.BadParameter(f"{scene!r} is not one of kill, driver-limits, dra, amd, all", param_hint="--scene")
    raise typer.Exit(run_demo(poll_interval_s=poll_interval, keep=keep, scene=scene))


def main() -> None:
    typer.run(_cli)
