"""Benchmark: what the agent's pod costs a node — CPU and memory of its container at a 1 Hz poll, as the kubelet's
own cgroups account them. Run as root, after scripts/test.sh (or controlplane.sh, helm.sh, image.sh and node.sh)
has built the parts.

    sudo .venv/bin/python bench/agent_pod.py                 # 8 GPU pods, 15 s warm-up, 60 s measured
    sudo .venv/bin/python bench/agent_pod.py --seconds 20    # shorter

It starts the real one-node cluster of the end-to-end tests (tests/cluster/real_cluster.py: kube-apiserver,
scheduler, controller-manager, a kubelet on containerd), installs the chart with the locally built image and
`--poll-interval=1`, starts `--pods` workload pods that each hold GPU memory within their quota (so the agent
watches and never acts), and then reads the agent container's cgroup once a second: CPU from `cpuacct.usage`
(the kubelet's and cAdvisor's source), memory as the working set (usage minus inactive file pages, what
`kubectl top` shows), plus the agent process's RSS and its scan count from /metrics.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

import yaml  # noqa: E402

from cluster.real_cluster import Cluster, real_cluster, unavailable_reason  # noqa: E402
from helm_fixtures import CHART, HELM  # noqa: E402
from vramguard.core.quantity import GiB, MiB  # noqa: E402
from vramguard_testbed.simnode import metric_value  # noqa: E402

CGROUP_V1 = Path("/sys/fs/cgroup")


def controller_dir(pid: int, controller: str) -> Path:
    """The v1 cgroup directory of `pid` in the hierarchy that holds `controller`."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            for mount in CGROUP_V1.iterdir():
                if controller in mount.name.split(","):
                    return mount / path.lstrip("/")
    raise LookupError(f"PID {pid} has no {controller} cgroup (this benchmark reads cgroup v1 controllers)")


def working_set(memory_dir: Path) -> int:
    usage = int((memory_dir / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (memory_dir / "memory.stat").read_text().splitlines())
    return max(usage - int(stat.get("total_inactive_file", 0)), 0)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def scans(port: int) -> float:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        f"http://127.0.0.1:{port}/metrics", timeout=5
    ) as response:
        text = response.read().decode()
    return metric_value(text, "vramguard_scan_duration_seconds_count") or 0.0


def measure(cluster: Cluster, pods: int, warmup_s: float, seconds: float) -> None:
    started = time.monotonic()
    cluster.helm_install(mode="kill")
    print(f"agent Ready {time.monotonic() - started:.1f} s after helm install")
    ns = cluster.namespace("bench")
    used = {}
    for i in range(pods):
        pod = cluster.workload(ns, f"worker-{i}", "2Gi")
        used[cluster.pid(pod)] = 1 * GiB
    cluster.gpu(used)
    agent = cluster.agent_pod()
    assert agent is not None
    pid = cluster.pid(agent)
    port = int(cluster.values["metrics"]["port"])
    cpu_dir, memory_dir = controller_dir(pid, "cpuacct"), controller_dir(pid, "memory")
    print(f"agent container: PID {pid}, cgroup {cpu_dir.relative_to(CGROUP_V1)}; {pods} GPU pods; warm-up {warmup_s}s")
    time.sleep(warmup_s)

    cpu0, t0, scans0 = int((cpu_dir / "cpuacct.usage").read_text()), time.monotonic(), scans(port)
    memory, resident = [], []
    while time.monotonic() - t0 < seconds:
        time.sleep(1.0)
        memory.append(working_set(memory_dir))
        resident.append(rss(pid))
    cpu1, t1, scans1 = int((cpu_dir / "cpuacct.usage").read_text()), time.monotonic(), scans(port)
    elapsed = t1 - t0
    cores = (cpu1 - cpu0) / 1e9 / elapsed
    print(f"measured {elapsed:.0f} s, {scans1 - scans0:.0f} scans ({(scans1 - scans0) / elapsed:.2f} per s)")
    print(f"CPU: {cores * 1000:.1f} millicores ({cores * 100:.2f}% of one core)")
    print(
        f"memory working set: median {statistics.median(memory) / MiB:.1f} MiB, max {max(memory) / MiB:.1f} MiB; "
        f"agent RSS median {statistics.median(resident) / MiB:.1f} MiB"
    )
    requests = yaml.safe_load((CHART / "values.yaml").read_text())["resources"]["requests"]
    print(f"the chart's default requests, for comparison: cpu {requests['cpu']}, memory {requests['memory']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=8, help="workload pods holding GPU memory (default 8)")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring (default 15)")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds measured (default 60)")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None or not HELM.exists():
        sys.exit(f"agent_pod: cannot start the real node: {reason or f'no helm at {HELM} (scripts/helm.sh)'}")
    with real_cluster(HELM, poll_interval_s=1.0) as cluster:
        measure(cluster, args.pods, args.warmup, args.seconds)


if __name__ == "__main__":
    main()
