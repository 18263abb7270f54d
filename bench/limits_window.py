"""Benchmark: how early the driver holds a container's GPU memory limit, on the real node (issue 17). Run as root,
after scripts/test.sh (or controlplane.sh, helm.sh, image.sh and node.sh) has built the parts.

    sudo .venv/bin/python bench/limits_window.py              # 50 pods
    sudo .venv/bin/python bench/limits_window.py --quick      # 3 pods, a smoke test

It starts the real one-node cluster of the end-to-end tests (tests/cluster/real_cluster.py: a kubelet on
containerd), makes the test NVML an R615 driver that holds per-cgroup limits, installs the chart in kill mode with
the image scripts/image.sh last built (never rebuilt here: the header says when it was built and whether the
agent's sources changed since), creates all the pods at once, each with one container and a VRAM quota, waits for
them to run, then waits up to --timeout for the limits. For every container it prints, from the test NVML's log of
limit calls (each stamped on CLOCK_BOOTTIME) against /proc start times (clock ticks on the same clock):

- start: when the container's first process started (the earliest start among the processes of its cgroup: runc's
  init, which becomes the container's command), in seconds after the API server answered the pod's create;
- pod limit: when a limit was first set on the pod's cgroup (``.../pod<uid>``), in seconds after that start;
  negative is before it, "never" is not within the timeout;
- own limit: the same for the container's own (leaf) cgroup (``.../pod<uid>/<container id>``);
- exec: when the container's command ran, seen from inside: its shell reads /proc/uptime (CLOCK_BOOTTIME too)
  before it execs sleep, in seconds after the start. runc creates the container's cgroup while it sets up the
  init (the leaf can appear a little before or after the init's start) and holds the init until the kubelet
  starts the container, so the command runs later than the start: a limit set on the leaf the moment it is
  created may come just after the start, and still before the exec, the workload's first instruction.

Only successful sets with a hard limit count (a clear is a set to NVML_DEVICE_MEMORY_LIMIT_MAX). Start times and
/proc/uptime have the resolution of a clock tick (10 ms at 100 Hz): a limit within one tick after a start is
counted apart, as undecided. The figures are printed, never judged: run it before and after a change, on the same
machine, and compare.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from kubernetes import client  # noqa: E402

from cluster.containerd import IMAGES  # noqa: E402
from cluster.node import raw  # noqa: E402
from cluster.real_cluster import AGENT_NS, GPU_TOTAL, QUOTA, Cluster, real_cluster, unavailable_reason  # noqa: E402
from helm_fixtures import HELM  # noqa: E402
from vramguard import __version__  # noqa: E402
from vramguard.core.quantity import MiB  # noqa: E402
from vramguard.node.cgroup import v2_root as find_v2_root  # noqa: E402
from vramguard_testbed.fakenvml import LimitCall, limit_calls  # noqa: E402
from vramguard_testbed.waiting import WaitTimeout, wait_until  # noqa: E402

LIMIT_MAX = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX: a set to it clears the limit
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
CGROUP_ROOT = Path("/sys/fs/cgroup")
QUOTA_MIB = 256  # 50 pods x 256Mi = 12.5Gi: within the test GPU's 24Gi, which the scheduler places pods against
NAMESPACE = "bench"
# The container's command, seen from inside: the shell's builtins read CLOCK_BOOTTIME (no fork), then it becomes the
# image's sleep.
COMMAND = ["/bin/sh", "-c", 'read up idle < /proc/uptime; echo "exec $up"; exec /bin/sleep 1000000']
# What goes into the agent's image (Dockerfile, .dockerignore): a change after the image was built is not in it.
IMAGE_INPUTS = ("src", "pyproject.toml", "Dockerfile")


@dataclass
class Row:
    pod: str
    created_s: float  # CLOCK_BOOTTIME when the API server answered the pod's create
    container: str = "main"
    uid: str = ""
    container_id: str = ""
    pod_cgroup: str = ""  # relative to the v2 root: /kubepods/<qos>/pod<uid>
    leaf_cgroup: str = ""  # .../pod<uid>/<container id>
    start_s: float | None = None  # CLOCK_BOOTTIME at the tick the first process started
    exec_s: float | None = None  # CLOCK_BOOTTIME at the tick the command read /proc/uptime
    pod_limit_s: float | None = None  # CLOCK_BOOTTIME of the first successful set on the pod's cgroup
    own_limit_s: float | None = None  # ... on the leaf


# -- clocks and /proc --------------------------------------------------------------------------------------------


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def start_time(pid: int) -> float | None:
    """When `pid` started, in seconds on CLOCK_BOOTTIME (field 22 of /proc/<pid>/stat, in clock ticks)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19]) * TICK_S


def v2_root() -> Path:
    """The cgroup v2 hierarchy (`vramguard.node.cgroup.v2_root`); exits where the host has none."""
    root = find_v2_root(str(CGROUP_ROOT))
    if root is not None:
        return Path(root)
    raise SystemExit("limits_window: no cgroup v2 hierarchy on this host: the driver's limits need one")


def v2_cgroup(pid: int) -> str:
    """The cgroup v2 directory of `pid`, relative to the v2 root (its "0::" line in /proc/<pid>/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise LookupError(f"PID {pid} has no cgroup v2 line in /proc/{pid}/cgroup")


def first_start(leaf: Path, init_pid: int) -> float | None:
    """The earliest start among the container's init and every process in its cgroup (and its sub-cgroups)."""
    pids = {init_pid}
    for directory, _subdirs, _files in os.walk(leaf):
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (Path(directory) / "cgroup.procs").read_text().split())
    starts = [s for s in map(start_time, sorted(pids)) if s is not None]
    return min(starts, default=None)


# -- what was built ----------------------------------------------------------------------------------------------


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
    return done.stdout.rstrip("\n") if done.returncode == 0 else "?"


def newest_input() -> tuple[float, str]:
    """The newest modification among the image's inputs in the working tree: (mtime, path)."""
    newest = (0.0, "")
    for name in IMAGE_INPUTS:
        top = REPO / name
        paths: Iterable[Path] = [top] if top.is_file() else (p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if "__pycache__" in path.parts or path.name.endswith(".egg-info"):
                continue
            mtime = path.stat().st_mtime
            if mtime > newest[0]:
                newest = (mtime, str(path.relative_to(REPO)))
    return newest


def stamp(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s).astimezone().isoformat(timespec="seconds")


def describe_build() -> None:
    """The agent's version, the working tree's commit, and when the image the chart will run was built."""
    changed = [line[3:] for line in git("status", "--porcelain", "--", *IMAGE_INPUTS).splitlines() if line]
    print(
        f"agent: vramguard {__version__}; working tree {git('describe', '--always', '--dirty', '--tags')} "
        f"(HEAD {git('log', '-1', '--format=%h %cI %s')[:100]})"
    )
    print(f"last commit to the image's inputs: {git('log', '-1', '--format=%h %cI %s', '--', *IMAGE_INPUTS)[:100]}")
    print(f"uncommitted changes to the image's inputs: {', '.join(changed) or 'none'}")
    image = IMAGES / f"vramguard-{__version__}.tar"
    built = image.stat().st_mtime
    print(f"image: {image}, built {stamp(built)} (file mtime; this bench never rebuilds it: scripts/image.sh does)")
    mtime, path = newest_input()
    if mtime > built:
        print(f"image: STALE? {path} changed {stamp(mtime)}, after the image was built")
    else:
        print(f"image: no input changed since it was built (newest: {path}, {stamp(mtime)})")


# -- the run -----------------------------------------------------------------------------------------------------


def other_kubelets() -> list[int]:
    """PIDs of kubelets already running: another real node shares this host's /kubepods, address and bridge."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "kubelet":
                    found.append(int(entry.name))
    return found


def create_pods(cluster: Cluster, count: int) -> list[Row]:
    rows = []
    for i in range(count):
        name = f"quota-{i:03d}"
        cluster.create_workload(NAMESPACE, name, f"{QUOTA_MIB}Mi", command=COMMAND)
        rows.append(Row(name, boottime()))
    return rows


def wait_running(cluster: Cluster, rows: list[Row], timeout_s: float) -> None:
    """Wait until every pod runs, then find each container: its ID, init PID, cgroups and first start."""
    by_name = {row.pod: row for row in rows}
    running: dict[str, dict[str, Any]] = {}

    def all_running() -> bool:
        for pod in raw(cluster.api, cluster.core.list_namespaced_pod(NAMESPACE))["items"]:
            statuses = pod["status"].get("containerStatuses") or []
            if pod["status"].get("phase") == "Running" and statuses and "running" in statuses[0].get("state", {}):
                running[pod["metadata"]["name"]] = pod
        return len(running) == len(rows)

    try:
        wait_until(all_running, timeout_s, what="every pod Running", interval_s=1.0)
    except WaitTimeout:
        pending = sorted(set(by_name) - set(running))
        raise SystemExit(
            f"limits_window: {len(pending)} pods not Running after {timeout_s:.0f} s: {pending[:10]}"
        ) from None
    tasks = {}
    for line in cluster.node.containerd.ctr("task", "ls").splitlines()[1:]:
        task, task_pid, task_status = line.split()[:3]
        if task_status == "RUNNING":
            tasks[task] = int(task_pid)
    root = v2_root()
    for name, pod in running.items():
        row = by_name[name]
        (status,) = pod["status"]["containerStatuses"]
        row.uid = pod["metadata"]["uid"]
        row.container = status["name"]
        row.container_id = status["containerID"].removeprefix("containerd://")
        pid = tasks[row.container_id]
        row.leaf_cgroup = v2_cgroup(pid)
        row.pod_cgroup = row.leaf_cgroup.rsplit("/", 1)[0]
        if not (row.pod_cgroup.endswith(f"/pod{row.uid}") and row.leaf_cgroup.endswith(f"/{row.container_id}")):
            raise SystemExit(f"limits_window: {name}'s init PID {pid} is in {row.leaf_cgroup}, not its container's")
        row.start_s = first_start(root / row.leaf_cgroup.lstrip("/"), pid)


def read_exec(cluster: Cluster, row: Row) -> None:
    """The container's own report of when its command ran (its first log line), once it is there."""
    if row.exec_s is not None:
        return
    with contextlib.suppress(client.ApiException):
        log = cluster.core.read_namespaced_pod_log(row.pod, NAMESPACE, container=row.container)
        for line in str(log).splitlines():
            if line.startswith("exec "):
                row.exec_s = float(line.split()[1])
                return


def first_sets(calls: Sequence[LimitCall], until_s: float) -> dict[str, float]:
    """Each cgroup's (as the agent named it) first successful set of a hard limit, up to `until_s`."""
    first: dict[str, float] = {}
    for call in calls:
        if call.verb == "set" and call.result == 0 and call.hard_bytes != LIMIT_MAX and call.at_s <= until_s:
            first[call.cgroup] = min(first.get(call.cgroup, call.at_s), call.at_s)
    return first


def when_set(first: dict[str, float], relative: str) -> float | None:
    """The first set on the cgroup whose path, as the agent sees it, ends in `relative` (a v2-root-relative path)."""
    times = [at for cgroup, at in first.items() if cgroup.endswith(relative)]
    return min(times, default=None)


def wait_limits(cluster: Cluster, rows: list[Row], timeout_s: float) -> tuple[float, list[LimitCall]]:
    """Poll the call log until every container's pod and own limits are set, or `timeout_s`: the seconds waited
    and the calls logged by then."""
    started = time.monotonic()
    deadline = boottime() + timeout_s
    while True:
        now = boottime()
        calls = [c for c in limit_calls(cluster.gpu_state) if c.at_s <= deadline]
        first = first_sets(calls, min(now, deadline))
        for row in rows:
            row.pod_limit_s = when_set(first, row.pod_cgroup)
            row.own_limit_s = when_set(first, row.leaf_cgroup)
            read_exec(cluster, row)
        done = all(r.pod_limit_s is not None and r.own_limit_s is not None and r.exec_s is not None for r in rows)
        if done or now >= deadline:
            return time.monotonic() - started, calls
        time.sleep(0.5)


# -- the report --------------------------------------------------------------------------------------------------


def relative(at: float | None, origin: float | None) -> float | None:
    return None if at is None or origin is None else at - origin


def shown(value: float | None, never: str = "never") -> str:
    return never if value is None else f"{value:+.2f}"


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


def print_table(rows: list[Row]) -> None:
    print()
    print(f"{'pod':<10} {'container':<9} {'start':>7} {'pod limit':>10} {'own limit':>10} {'exec':>7}")
    for row in rows:
        start = relative(row.start_s, row.created_s)
        print(
            f"{row.pod:<10} {row.container:<9} {shown(start, '?'):>7} "
            f"{shown(relative(row.pod_limit_s, row.start_s)):>10} {shown(relative(row.own_limit_s, row.start_s)):>10} "
            f"{shown(relative(row.exec_s, row.start_s), '?'):>7}"
        )
    print(
        "start: s after the pod's create; pod limit, own limit, exec: s after the container's first process started "
        "(negative: before it)"
    )


def summarize(rows: list[Row], what: str, at: str, origin: str, origin_name: str) -> None:
    """One line: how many of the containers had the limit `at` before `origin`, and the lags' spread."""
    lags = [relative(getattr(r, at), getattr(r, origin)) for r in rows]
    found = [lag for lag in lags if lag is not None]
    before = sum(1 for lag in found if lag < 0)
    undecided = sum(1 for lag in found if 0 <= lag < TICK_S)
    never = sum(1 for r in rows if getattr(r, at) is None)
    spread = (
        f"lag median {statistics.median(found):+.2f} s, p95 {percentile(found, 0.95):+.2f} s, max {max(found):+.2f} s"
        if found
        else "no lag: never set"
    )
    print(
        f"{what} before {origin_name}: {before}/{len(rows)} ({undecided} within a tick after it, undecided; "
        f"{never} never set); {spread}"
    )


def print_summary(rows: list[Row]) -> None:
    print()
    print(f"summary of {len(rows)} containers (a tick is {TICK_S * 1000:.0f} ms):")
    summarize(rows, "pod limit", "pod_limit_s", "start_s", "the first process")
    summarize(rows, "own limit", "own_limit_s", "start_s", "the first process")
    summarize(rows, "pod limit", "pod_limit_s", "exec_s", "the exec")
    summarize(rows, "own limit", "own_limit_s", "exec_s", "the exec")
    starts = [s for s in (relative(r.start_s, r.created_s) for r in rows) if s is not None]
    execs = [e for e in (relative(r.exec_s, r.start_s) for r in rows) if e is not None]
    if starts:
        print(f"first process after the create: median {statistics.median(starts):.2f} s, max {max(starts):.2f} s")
    if execs:
        print(f"exec after the first process: median {statistics.median(execs):.2f} s, max {max(execs):.2f} s")


def agent_diagnosis(cluster: Cluster) -> None:
    """What the agent's pod says about itself, for a run that never saw it Ready."""
    for args in (
        ("describe", "pods"),
        ("logs", "daemonset/vramguard", "--tail=40"),
        ("logs", "daemonset/vramguard", "--previous"),
    ):
        done = cluster.node.kubectl(*args, "--namespace", AGENT_NS, check=False)
        print(f"$ kubectl {' '.join(args)} --namespace {AGENT_NS}\n{done.stdout[-4000:]}{done.stderr[-2000:]}")


def measure(cluster: Cluster, pods: int, running_timeout_s: float, limits_timeout_s: float) -> None:
    began = time.monotonic()
    cluster.gpu({}, memory_limits=True)
    try:
        cluster.helm_install(mode="kill")
    except WaitTimeout as e:
        agent_diagnosis(cluster)
        raise SystemExit(f"limits_window: {e}") from None

    def capacity() -> bool:
        node = raw(cluster.api, cluster.core.read_node(cluster.node.name))
        return bool(node["status"].get("allocatable", {}).get(QUOTA) == str(GPU_TOTAL))

    try:
        wait_until(capacity, 60, what="the node's VRAM capacity published", interval_s=0.5)
    except WaitTimeout:
        raise SystemExit("limits_window: the agent did not publish the node's VRAM capacity within 60 s") from None
    print(f"agent Ready and capacity published {time.monotonic() - began:.1f} s after helm install (kill mode)")
    cluster.namespace(NAMESPACE)

    began = time.monotonic()
    rows = create_pods(cluster, pods)
    print(f"{pods} pods created in {time.monotonic() - began:.1f} s, each one container with {QUOTA_MIB}Mi of VRAM")
    wait_running(cluster, rows, running_timeout_s)
    print(f"all {pods} running {time.monotonic() - began:.1f} s after the first create")
    waited, calls = wait_limits(cluster, rows, limits_timeout_s)
    print(f"waited {waited:.1f} s for the limits (up to {limits_timeout_s:.0f} s)")
    sets = [c for c in calls if c.verb == "set"]
    failed = sorted({c.result for c in sets if c.result != 0})
    print(
        f"limit calls logged: {len(sets)} sets ({sum(c.result == 0 for c in sets)} succeeded"
        f"{f', failures {failed}' if failed else ''}; {sum(c.hard_bytes == LIMIT_MAX for c in sets)} clears), "
        f"{len(calls) - len(sets)} gets"
    )
    print_table(rows)
    print_summary(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=50, help="pods, one container each (default 50)")
    parser.add_argument("--quick", action="store_true", help="3 pods: a smoke test")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="the agent's (default 1.0, its own default)")
    parser.add_argument("--timeout", type=float, default=30.0, help="s to wait for limits once all run (default 30)")
    parser.add_argument("--running-timeout", type=float, default=300.0, help="s to wait for all pods to run")
    args = parser.parse_args()
    pods = 3 if args.quick else args.pods
    if not 1 <= pods <= GPU_TOTAL // (QUOTA_MIB * MiB):
        parser.error(f"--pods must be 1 to {GPU_TOTAL // (QUOTA_MIB * MiB)}: the test GPU holds that many quotas")

    reason = unavailable_reason()
    if reason is None and not HELM.exists():
        reason = f"no helm at {HELM} (scripts/helm.sh builds it)"
    if reason is not None:
        print(f"limits_window: skipped, cannot start the real node: {reason}", file=sys.stderr)
        sys.exit(2)
    if others := other_kubelets():
        print(f"limits_window: waiting for another real node to stop (kubelet PID {others})", file=sys.stderr)
        try:
            wait_until(lambda: not other_kubelets(), 600, what="the other kubelets to stop", interval_s=5)
        except WaitTimeout:
            print("limits_window: skipped, another kubelet still runs after 10 minutes", file=sys.stderr)
            sys.exit(2)

    began = time.monotonic()
    print(
        f"limits window: {pods} pods, R615 test NVML, kill mode, agent poll {args.poll_interval} s, "
        f"on {os.cpu_count()} CPUs"
    )
    describe_build()
    with real_cluster(HELM, poll_interval_s=args.poll_interval) as cluster:
        print(f"cluster up in {time.monotonic() - began:.1f} s")
        measure(cluster, pods, args.running_timeout, args.timeout)
        stopping = time.monotonic()
    print(f"cluster stopped in {time.monotonic() - stopping:.1f} s; whole run {time.monotonic() - began:.1f} s")


if __name__ == "__main__":
    main()
