"""Benchmark: what a fleet of agents costs one real API server. Run as root, after scripts/controlplane.sh.

    sudo .venv/bin/python bench/fleet.py                       # 50 agents, 120 s windows: about 10 minutes
    sudo .venv/bin/python bench/fleet.py --quick               # 3 agents, short windows: about 80 s
    git clone -q /work/main /tmp/before && git -C /tmp/before checkout -q 9e0be43
    sudo .venv/bin/python bench/fleet.py --src /tmp/before/src # the agent of another checkout, same run shape

It starts a real etcd and kube-apiserver (tests/cluster/controlplane.py) with an audit log of every request
(level Metadata), applies the agent's manifest (RBAC and admission policy; from the checkout of --src where it
has one), and builds the fleet of tests/cluster/fleet.py: --agents Nodes, each with --pods-per-node running
pods bound to it (a share of them quota'd by annotation, the rest by `vramguard.io/vram` limits), each pod's
process real, in a real kubelet-shaped cgroup, listed in the node's own test NVML state under its quota; with DRA
(on where the API server serves resource.k8s.io/v1) each node publishes a ResourceSlice and the agents read quotas
from claims first, so they watch their node's ResourceSlices too. Then, in one run, back to back:

1. baseline: a --window with no agent running;
2. steady state: one real `vramguard run --mode warn` per node (own NVML state, metrics port, state directory,
   the agent's token bound to its pod on that node), all ready (/readyz), a --warmup, then a --window;
3. the plugin: --plugin-reads reads of every agent's /status as `kubectl vramguard top -A` makes them (its code,
   in-process, with the admin kubeconfig): the agent pods listed by label, each agent read through the API server's
   pod proxy (16 at a time), merged and rendered; the time to a full table, the rows and agents answered, and the
   requests each read made (audit log, by the plugin's user agent), extrapolated to 1,000 and 5,000 nodes;
4. restart: the API server stopped and started again (same port, certificates and etcd), then --after-restart
   seconds watched: the agents' LISTs (histogram, first, last, spread), when each agent watches again (audit
   log: its watches open at the end; and apiserver_longrunning_requests back at its count before the restart),
   and the scans the agents did meanwhile against what their poll interval promises;
5. mass violation: on --violating of the nodes every pod's process goes over its quota (warn mode: Events, no
   kills); the agents' Event writes (create/patch on events) per minute over a --violation-window.

Printed: the agents' requests per agent per minute by verb and resource (audit log, the agents' ServiceAccount;
the user agents seen), apiserver_request_total per minute by verb and resource (all clients) against the
baseline, apiserver_longrunning_requests, etcd's gRPC calls, and the CPU of the API server, etcd and the agents
(utime + stime from /proc, in millicores) against the baseline; what agent-shaped watches of the first node (its
pods, its Node, its ResourceSlices; from a LIST's resourceVersion, bookmarks on) received in each window and after
the restart, bookmarks above all; then the plugin, the restart and the violation; and the per-agent figures
extrapolated to 1,000 and 5,000 nodes beside the kubelet's documented steady cost. The machine may be shared and
its CPU noisy: compare the ratios within one run, and runs of the same shape on one machine.

The etcd is the one on PATH (scripts/controlplane.sh installs Debian's, 3.4.23), or --etcd. The API server sends a
watch its periodic bookmark (about once a minute) only when its watch cache of that resource holds a
resourceVersion newer than the watch's: after an event of any object of the resource, or, with an etcd that
answers watch progress requests (3.4.31 and later, 3.5.13 and later), sometimes without one. Nothing else changes
pods, Nodes or ResourceSlices here, so the bench's watches see few bookmarks or none (none with etcd 3.4.23), where
a real cluster's kubelets and controllers change them all the time. Without watch progress requests, consistent
LISTs (resourceVersion unset) are served by etcd rather than the watch cache too. The header says which case a
run was.

Agents on one machine keep to their own pods (see tests/cluster/fleet.py: no cgroup watcher in warn mode,
NVML states per node, pod caches per node); the run checks it from each agent's metrics. Its pod cgroups are the
systemd driver's (kubepods.slice), which the test node's kubelet (cgroupfs driver: /kubepods) never looks at, so it
runs beside a real node. Exit status 2: not runnable here (not root, no cgroup v2, no control plane built).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from kubernetes import client  # noqa: E402

from cluster.controlplane import (  # noqa: E402
    NEWEST,
    AuditEvent,
    ControlPlane,
    binaries_dir,
    serves_dra,
    unavailable_reason,
)
from cluster.fleet import (  # noqa: E402
    AGENT_USER,
    PLUGIN_USER_AGENT,
    QUOTA,
    Fleet,
    PluginRead,
    agent_requests,
    audited_until_now,
    describe,
    plugin_requests,
    read_with_plugin,
)
from cluster.kube_fixtures import MANIFEST, deploy_manifest  # noqa: E402
from vramguard.plugin.fetch import WORKERS  # noqa: E402
from vramguard_testbed.cgroups import cgroups_unavailable  # noqa: E402

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
SCALES = (1000, 5000)
LIST_PAGE = 500  # the plugin's LIST of the agent pods asks for pages of this many (fetch.find_agents)
# The kubelet's documented defaults (not measured here): it renews its node's Lease every 10 s (a quarter of
# nodeLeaseDurationSeconds, 40 s) and, when nothing changed, reports node status every nodeStatusReportFrequency
# (5 minutes).
KUBELET_LEASE_PER_MIN = 6.0
KUBELET_STATUS_PER_MIN = 0.2
# The resources an agent may watch: its node's pods, its Node, its node's ResourceSlices.
WATCHED = ("pods", "nodes", "resourceslices")
Key = tuple[str, str, str, str]  # verb, group, resource, subresource

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<k>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<v>(?:[^"\\]|\\.)*)"')


# -- reading the parts -------------------------------------------------------------------------------------------


def samples(text: str, name: str) -> Iterator[tuple[dict[str, str], float]]:
    """(labels, value) of each sample of `name` in Prometheus text; a line filter, fast enough for the
    apiserver's whole /metrics every second."""
    prefix = name + "{"
    for line in text.splitlines():
        if not (line.startswith(prefix) or line.startswith(name + " ")):
            continue
        match = _SAMPLE.match(line)
        if match is None or match["name"] != name:
            continue
        labels = {m["k"]: m["v"] for m in _LABEL.finditer(match["labels"] or "")}
        yield labels, float(match["value"])


def by_request(text: str, name: str) -> dict[Key, float]:
    """A metric of the apiserver's summed by (verb, group, resource, subresource): over codes, scopes, versions."""
    totals: dict[Key, float] = {}
    for labels, value in samples(text, name):
        key = (
            labels.get("verb", ""),
            labels.get("group", ""),
            labels.get("resource", ""),
            labels.get("subresource", ""),
        )
        totals[key] = totals.get(key, 0.0) + value
    return totals


def cpu_ticks(pid: int) -> int:
    """utime + stime of `pid`, all threads (fields 14 and 15 of /proc/<pid>/stat); 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of every core, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


@dataclass(frozen=True)
class Reading:
    """What is read at each end of a window."""

    at_s: float  # time.time(), the audit log's clock
    apiserver_ticks: int
    etcd_ticks: int
    agent_ticks: dict[int, int]
    busy: int
    total: int
    requests: dict[Key, float]  # apiserver_request_total
    longrunning: dict[Key, float]  # apiserver_longrunning_requests
    etcd_calls: dict[str, float]  # grpc_server_handled_total by grpc_method


def read(plane: ControlPlane, agent_pids: Sequence[int]) -> Reading:
    # CPU first: the scrapes below cost the apiserver and etcd some, the same in every window.
    apiserver, etcd = cpu_ticks(plane.pid("kube-apiserver")), cpu_ticks(plane.pid("etcd"))
    agents = {pid: cpu_ticks(pid) for pid in agent_pids}
    busy, total = machine_jiffies()
    at_s = time.time()
    text = plane.apiserver_metrics()
    etcd_calls: dict[str, float] = {}
    for labels, value in samples(plane.etcd_metrics(), "grpc_server_handled_total"):
        method = labels.get("grpc_method", "")
        etcd_calls[method] = etcd_calls.get(method, 0.0) + value
    return Reading(
        at_s=at_s,
        apiserver_ticks=apiserver,
        etcd_ticks=etcd,
        agent_ticks=agents,
        busy=busy,
        total=total,
        requests=by_request(text, "apiserver_request_total"),
        longrunning=by_request(text, "apiserver_longrunning_requests"),
        etcd_calls=etcd_calls,
    )


# An agent's watches: (resource, field selector of one node). The renewal timeout they ask the server for: far
# beyond a window, as an agent's 5 to 10 minutes, so that the bookmark the server sends 2 s before a watch's timeout
# never falls inside the window and only the periodic ones show.
AGENT_WATCHES = (("pods", "spec.nodeName"), ("nodes", "metadata.name"), ("resourceslices", "spec.nodeName"))
WATCH_TIMEOUT_S = 600


class BookmarkWatch(threading.Thread):
    """An agent-shaped watch, as admin: `resource` with the field selector `field` = the node's name, from a
    LIST's resourceVersion, bookmarks on, until `stop()`; notes when each event arrived, by type."""

    def __init__(self, plane: ControlPlane, resource: str, field: str, node_name: str) -> None:
        super().__init__(name=f"bookmark-watch-{resource}", daemon=True)
        self.plane, self.resource, self.selector = plane, resource, f"{field}={node_name}"
        self.events: list[tuple[float, str]] = []
        self.error: str | None = None
        self.started_s = self.stopped_s = 0.0
        self._response: Any = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            with self.plane.api_client() as api:
                if self.resource == "pods":
                    list_call: Any = client.CoreV1Api(api).list_pod_for_all_namespaces
                elif self.resource == "nodes":
                    list_call = client.CoreV1Api(api).list_node
                else:
                    list_call = client.ResourceV1Api(api).list_resource_slice
                listed: Any = list_call(field_selector=self.selector)
                self.started_s = time.time()
                self._response = list_call(
                    field_selector=self.selector, watch=True, allow_watch_bookmarks=True,
                    resource_version=listed.metadata.resource_version, timeout_seconds=WATCH_TIMEOUT_S,
                    _preload_content=False,
                )  # fmt: skip
                if self._stopping.is_set():
                    return
                pending = b""
                for chunk in self._response.stream(4096):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    self.events += [(time.time(), str(json.loads(line).get("type"))) for line in lines if line.strip()]
        except Exception as e:  # reported with the figures, never fatal
            if not self._stopping.is_set():
                self.error = f"{type(e).__name__}: {e}"

    def stop(self) -> None:
        """End the watch now (from another thread): shutdown() interrupts the read blocked in `run`."""
        self.stopped_s = time.time()
        self._stopping.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.shutdown()
        self.join(timeout=10)


@dataclass
class Window:
    """One measured window: readings at both ends, and the audit log of the time between."""

    name: str
    first: Reading
    last: Reading
    audit: list[AuditEvent]
    bookmarks: list[BookmarkWatch] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.last.at_s - self.first.at_s

    def millicores(self, what: str) -> float:
        if what == "agents":
            ticks = sum(self.last.agent_ticks.get(p, t) - t for p, t in self.first.agent_ticks.items())
        else:
            ticks = getattr(self.last, f"{what}_ticks") - getattr(self.first, f"{what}_ticks")
        return 1000.0 * ticks * TICK_S / self.seconds

    def busy_millicores(self) -> float:
        busy, total = self.last.busy - self.first.busy, self.last.total - self.first.total
        return 1000.0 * (os.cpu_count() or 1) * busy / total if total else 0.0

    def per_minute(self, counts: Mapping[Key, float], before: Mapping[Key, float]) -> dict[Key, float]:
        return {k: (v - before.get(k, 0.0)) * 60.0 / self.seconds for k, v in counts.items()}


def start_watches(plane: ControlPlane, node_name: str, dra: bool) -> list[BookmarkWatch]:
    """The watches an agent of `node_name` holds (`AGENT_WATCHES`; ResourceSlices with DRA), started."""
    watches = [
        BookmarkWatch(plane, resource, field, node_name)
        for resource, field in AGENT_WATCHES
        if dra or resource != "resourceslices"
    ]
    for watch in watches:
        watch.start()
    return watches


def measure(name: str, plane: ControlPlane, fleet: Fleet, seconds: float, progress: bool) -> Window:
    first = read(plane, fleet.agent_pids())
    watches = start_watches(plane, fleet.nodes[0].name, fleet.dra)
    say(f"{name}: measuring {seconds:g}s", progress)
    time.sleep(seconds)
    last = read(plane, fleet.agent_pids())
    for watch in watches:
        watch.stop()
    audit = [e for e in plane.audit_events() if first.at_s <= e.at_s < last.at_s]
    return Window(name, first, last, audit, watches)


def say(text: str, progress: bool) -> None:
    if progress:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- the report --------------------------------------------------------------------------------------------------


def resource_name(key: Key) -> str:
    _, group, resource, sub = key
    return (f"{group}/" if group else "") + resource + (f"/{sub}" if sub else "")


def rate(value: float) -> str:
    if abs(value) < 0.0005:
        return "0"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def table(header: Sequence[str], rows: Iterable[Sequence[object]], widths: Sequence[int]) -> list[str]:
    def line(cells: Sequence[object]) -> str:
        first, *rest = (str(c) for c in cells)
        return f"  {first:<{widths[0]}}" + "".join(f" {c:>{w}}" for c, w in zip(rest, widths[1:], strict=True))

    out = [line(header)]
    out += [line(r) for r in rows]
    return out


def query(event: AuditEvent) -> str:
    """The LIST's or WATCH's parameters that decide where it is served from: resourceVersion and selectors."""
    params = urllib.parse.parse_qs(urllib.parse.urlsplit(event.request_uri).query)
    shown = []
    rv = params.get("resourceVersion", [""])[0]
    shown.append("rv=" + ("0" if rv == "0" else "unset" if rv == "" else "N"))
    for name in ("resourceVersionMatch", "fieldSelector", "labelSelector", "sendInitialEvents"):
        if name in params:
            value = params[name][0]
            shown.append(f"{name}={value.split('=')[0]}" if "Selector" in name else f"{name}={value}")
    return " ".join(shown)


def agent_request_table(events: Sequence[AuditEvent], agents: int, seconds: float) -> list[str]:
    counts = Counter(describe(e) for e in events)
    rows = [(what, n, rate(n / agents * 60.0 / seconds)) for what, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    total = sum(counts.values())
    others = sum(n for what, n in counts.items() if not what.startswith("watch "))
    rows.append(("all", total, rate(total / agents * 60.0 / seconds)))
    rows.append(("all but WATCH", others, rate(others / agents * 60.0 / seconds)))
    return table(("verb resource", "requests", "per agent/min"), rows, (28, 9, 14))


def metrics_table(baseline: Window, steady: Window, agents: int) -> list[str]:
    base = baseline.per_minute(baseline.last.requests, baseline.first.requests)
    with_agents = steady.per_minute(steady.last.requests, steady.first.requests)
    rows = []
    for key in sorted(set(base) | set(with_agents), key=lambda k: (k[0], resource_name(k))):
        b, a = base.get(key, 0.0), with_agents.get(key, 0.0)
        if round(b, 3) == 0 and round(a, 3) == 0:
            continue
        rows.append((f"{key[0]} {resource_name(key)}", rate(b), rate(a), rate(a - b), rate((a - b) / agents)))
    return table(("verb resource", "baseline", "agents", "delta", "delta/agent"), rows, (44, 9, 9, 9, 11))


def longrunning_table(baseline: Window, steady: Window) -> list[str]:
    """The requests whose count changed, and a line for the others."""
    rows = []
    same = same_count = 0.0
    keys = set(baseline.last.longrunning) | set(steady.last.longrunning)
    for key in sorted(keys, key=lambda k: (k[0], resource_name(k))):
        b, a = baseline.last.longrunning.get(key, 0.0), steady.last.longrunning.get(key, 0.0)
        if a != b:
            rows.append((f"{key[0]} {resource_name(key)}", f"{b:.0f}", f"{a:.0f}", f"{a - b:+.0f}"))
        elif a:
            same, same_count = same + 1, same_count + a
    rows.append((f"{same:.0f} others, unchanged (the apiserver's own)", f"{same_count:.0f}", f"{same_count:.0f}", "+0"))
    return table(("verb resource", "baseline", "agents", "delta"), rows, (44, 9, 9, 7))


def etcd_table(baseline: Window, steady: Window) -> list[str]:
    rows = []

    def per_min(w: Window, method: str) -> float:
        return (w.last.etcd_calls.get(method, 0.0) - w.first.etcd_calls.get(method, 0.0)) * 60.0 / w.seconds

    for method in sorted(set(baseline.last.etcd_calls) | set(steady.last.etcd_calls)):
        b, a = per_min(baseline, method), per_min(steady, method)
        if round(b, 3) or round(a, 3):
            rows.append((method, rate(b), rate(a), rate(a - b)))
    return table(("gRPC method (per minute)", "baseline", "agents", "delta"), rows, (28, 9, 9, 9))


def cpu_table(baseline: Window, steady: Window, agents: int) -> list[str]:
    rows = []
    for what, label in (("apiserver", "kube-apiserver"), ("etcd", "etcd")):
        b, a = baseline.millicores(what), steady.millicores(what)
        ratio = f"{a / b:.2f}x" if b > 0 else "-"
        rows.append((label, f"{b:.0f}m", f"{a:.0f}m", ratio, f"{(a - b) / agents:+.1f}m"))
    a = steady.millicores("agents")
    rows.append((f"the {agents} agents", "-", f"{a:.0f}m", "-", f"{a / agents:.1f}m"))
    b, a = baseline.busy_millicores(), steady.busy_millicores()
    rows.append((f"machine ({os.cpu_count()} cores)", f"{b:.0f}m", f"{a:.0f}m", f"{a / b:.2f}x" if b else "-", "-"))
    return table(("process", "baseline", "agents", "ratio", "per agent"), rows, (22, 9, 9, 7, 10))


def bookmark_lines(name: str, watches: Sequence[BookmarkWatch]) -> list[str]:
    """What each watch received, by type, and when its bookmarks came (seconds since the watch began)."""
    lines = []
    for watch in watches:
        what = f"  {name}, {watch.resource} {watch.selector.split('=')[0]}=<node>:"
        if watch.error is not None:
            lines.append(f"{what} the watch failed: {watch.error}")
            continue
        kinds = Counter(kind for _, kind in watch.events)
        times = [f"+{at - watch.started_s:.0f}s" for at, kind in watch.events if kind == "BOOKMARK"]
        shown = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no event"
        lines.append(
            f"{what} {shown} in {watch.stopped_s - watch.started_s:.0f}s"
            + (f" (bookmarks at {', '.join(times)})" if times else "")
        )
    return lines


@dataclass
class RestartResult:
    stopped_s: float  # the stop began (SIGTERM)
    starting_s: float  # the process had exited; started again
    back_s: float
    end_s: float
    audit: list[AuditEvent]  # the agents' requests from the stop to the end
    expected_watches: set[tuple[str, str]]  # (node, resource) each agent watched before the restart
    open_watches: dict[tuple[str, str], float]  # (node, resource) → when its watch open at the end started
    first_watches: dict[tuple[str, str], float]  # (node, resource) → when its first watch after the stop started
    gauge: list[tuple[float, dict[str, float]]]  # apiserver_longrunning_requests WATCH by resource, over time
    gauge_before: dict[str, float]
    scans_before: dict[str, float]
    scans_after: dict[str, float]
    poll_interval_s: float
    bookmarks: list[BookmarkWatch]  # agent-shaped watches opened once the API server was back
    steady_scan_ratio: float | None = None


def watch_gauge(plane: ControlPlane, own: Sequence[BookmarkWatch] = ()) -> dict[str, float]:
    """Open WATCHes of the agents' resources (all clients but this bench's `own` watches), by resource."""
    opened: dict[str, float] = {}
    for (verb, _, resource, sub), value in by_request(
        plane.apiserver_metrics(), "apiserver_longrunning_requests"
    ).items():
        if verb == "WATCH" and resource in WATCHED and not sub:
            opened[resource] = opened.get(resource, 0.0) + value
    for watch in own:
        if watch.started_s and watch.error is None:
            opened[watch.resource] = opened.get(watch.resource, 0.0) - 1
    return opened


def restart(plane: ControlPlane, fleet: Fleet, after_s: float, agents_since_s: float, progress: bool) -> RestartResult:
    gauge_before = watch_gauge(plane)
    scans_before = {n.name: n.scans() for n in fleet.nodes}
    stopped_s = time.time()
    say("restart: stopping and starting the API server", progress)
    plane.stop_apiserver()
    starting_s = time.time()
    plane.start_apiserver()
    back_s = time.time()
    say(f"restart: back after {back_s - stopped_s:.1f}s; watching {after_s:g}s", progress)
    watches = start_watches(plane, fleet.nodes[0].name, fleet.dra)
    gauge: list[tuple[float, dict[str, float]]] = []
    while time.time() < back_s + after_s:
        tick = time.time()
        with contextlib.suppress(OSError):
            gauge.append((tick - back_s, watch_gauge(plane, watches)))
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
    for watch in watches:
        watch.stop()
    scans_after = {n.name: n.scans() for n in fleet.nodes}
    end_s = time.time()
    events = agent_requests(plane.audit_events(), since_s=agents_since_s)
    expected = {(e.node_name, e.resource) for e in events if e.verb == "watch" and e.at_s < stopped_s}
    open_watches: dict[tuple[str, str], float] = {}
    first_watches: dict[tuple[str, str], float] = {}
    for e in events:
        if e.verb == "watch" and e.at_s >= stopped_s and e.code == 200:
            key = (e.node_name, e.resource)
            first_watches[key] = min(first_watches.get(key, math.inf), e.at_s)
            if e.completed_s is None:
                open_watches[key] = min(open_watches.get(key, math.inf), e.at_s)
    return RestartResult(
        stopped_s=stopped_s,
        starting_s=starting_s,
        back_s=back_s,
        end_s=end_s,
        audit=[e for e in events if stopped_s <= e.at_s <= end_s],
        expected_watches=expected,
        open_watches=open_watches,
        first_watches=first_watches,
        gauge=gauge,
        gauge_before=gauge_before,
        scans_before=scans_before,
        scans_after=scans_after,
        poll_interval_s=fleet.poll_interval_s,
        bookmarks=watches,
    )


def histogram(times: Sequence[float], bucket_s: float) -> list[str]:
    if not times:
        return ["  (none)"]
    low = math.floor(min(times) / bucket_s)
    high = math.floor(max(times) / bucket_s)
    counts = Counter(math.floor(t / bucket_s) for t in times)
    peak = max(counts.values())
    scale = 50.0 / peak if peak > 50 else 1.0
    lines = []
    for b in range(low, high + 1):
        n = counts.get(b, 0)
        label = f"{b * bucket_s:+.0f}s..{(b + 1) * bucket_s:+.0f}s"
        lines.append(f"  {label:>12} {n:>5} {n / bucket_s:>6.1f}/s " + "#" * round(n * scale))
    return lines


def restart_lines(r: RestartResult, agents: int) -> list[str]:
    answered = [e.at_s for e in r.audit]
    first = (
        f"; the agents' first request after the stop was received {min(answered) - r.back_s:+.1f}s" if answered else ""
    )
    lines = [
        f"the API server was down {r.back_s - r.stopped_s:.1f}s: {r.starting_s - r.stopped_s:.1f}s from SIGTERM to its "
        f"exit, {r.back_s - r.starting_s:.1f}s from its start until it answered /readyz and a GET; times below are",
        f"from then, over the next {r.end_s - r.back_s:.0f}s (negative: before the readiness check saw it){first}",
        "",
        "the agents' requests from the stop on (audit log: verb resource, response code):",
    ]
    by_code = Counter(f"{describe(e)} {e.code}" for e in r.audit)
    lines += table(
        ("verb resource code", "requests", "per agent"),
        [(k, n, f"{n / agents:.2f}") for k, n in sorted(by_code.items(), key=lambda kv: -kv[1])] or [("(none)", 0, 0)],
        (34, 9, 10),
    )
    lists = [e for e in r.audit if e.verb == "list"]
    times = [e.at_s - r.back_s for e in lists]
    lines += ["", f"the agents' LISTs: {len(lists)} ({len(lists) / agents:.2f} per agent), in 2 s buckets:"]
    lines += histogram(times, 2.0)
    if times:
        peak = max(Counter(math.floor(t / 2.0) for t in times).values()) / 2.0
        lines.append(
            f"  first {min(times):+.1f}s, last {max(times):+.1f}s, spread {max(times) - min(times):.1f}s; "
            f"peak {peak:.1f} LIST/s; median {statistics.median(times):+.1f}s"
        )
        by_query = Counter(f"{e.resource} {query(e)}" for e in lists)
        lines.append("  as asked: " + "; ".join(f"{q}: {n}" for q, n in sorted(by_query.items())))
    missing = sorted(r.expected_watches - set(r.open_watches))
    waits = [r.open_watches[k] - r.back_s for k in r.expected_watches if k in r.open_watches]
    resources = sorted({res for _, res in r.expected_watches})
    lines += ["", f"watching again (audit log): each agent's watches before the restart: {', '.join(resources) or '-'}"]
    back = [r.first_watches[k] - r.back_s for k in r.expected_watches if k in r.first_watches]
    if back:
        lines.append(
            f"  {len(back)} of {len(r.expected_watches)} (agent, resource) watches back: the last at "
            f"{max(back):+.1f}s (median {statistics.median(back):+.1f}s), first WATCH answered 200 after the stop"
        )
    if waits:
        lines.append(
            f"  {len(waits)} of {len(r.expected_watches)} open at the end; the last of those started "
            f"{max(waits):+.1f}s (a renewal counts)"
        )
    if missing:
        shown = ", ".join(f"{node}:{res}" for node, res in missing[:5])
        lines.append(f"  NOT watching at the end: {len(missing)} ({shown}{', ...' if len(missing) > 5 else ''})")
    for resource in sorted(r.gauge_before):
        target = r.gauge_before[resource]
        reached = next((t for t, g in r.gauge if g.get(resource, 0.0) >= target), None)
        final = r.gauge[-1][1].get(resource, 0.0) if r.gauge else 0.0
        when = f"back at {reached:+.0f}s" if reached is not None else "never back"
        lines.append(
            f"  apiserver_longrunning_requests WATCH {resource} (all clients): {target:.0f} before, {when}, "
            f"{final:.0f} at the end"
        )
    elapsed = r.end_s - r.stopped_s
    expected = elapsed / r.poll_interval_s
    done = {n: r.scans_after.get(n, 0.0) - r.scans_before.get(n, 0.0) for n in r.scans_before}
    # An agent scans every poll interval from its own phase: floor(expected) scans fit the window whatever the phase.
    missed = {n: max(0.0, math.floor(expected) - d) for n, d in done.items()}
    worst = max(missed.values()) if missed else 0.0
    lines += [
        "",
        f"scans from the stop to the end ({elapsed:.0f}s at --poll-interval {r.poll_interval_s:g}s: "
        f"{expected:.1f} expected per agent):",
        f"  done {sum(done.values()):.0f} of {expected * len(done):.0f} expected (median per agent "
        f"{statistics.median(done.values()) if done else 0:.0f}); missed {sum(missed.values()):.0f} in all, "
        f"the worst agent {worst:.0f}",
    ]
    if r.steady_scan_ratio is not None:
        lines.append(
            f"  (in the steady window the agents did {100 * r.steady_scan_ratio:.0f}% of their expected scans)"
        )
    lines += ["", "agent-shaped watches opened once the API server was back (as in the steady window):"]
    return lines + bookmark_lines("after the restart", r.bookmarks)


def violation_lines(
    events: Sequence[AuditEvent],
    start_s: float,
    seconds: float,
    chosen: int,
    containers: int,
    deltas: Mapping[str, float],
) -> list[str]:
    writes = [e for e in events if e.resource == "events" and e.verb in ("create", "patch", "update")]
    lines = [
        f"{chosen} nodes, {containers} containers over their quota at +0s (warn mode); the agents' Event writes "
        f"(audit log) over {seconds:.0f}s:"
    ]
    # Whole minutes; a last part shorter than a second (the time the readings take) joins the minute before it.
    minutes = max(1, math.ceil((seconds - 1.0) / 60.0))
    for m in range(minutes):
        last = m == minutes - 1
        in_minute = [e for e in writes if m * 60 <= e.at_s - start_s and (last or e.at_s - start_s < (m + 1) * 60)]
        span = seconds - m * 60 if last else 60.0
        verbs = Counter(e.verb for e in in_minute)
        shown = ", ".join(f"{n} {v}" for v, n in sorted(verbs.items())) or "none"
        lines.append(
            f"  minute {m + 1} ({span:.0f}s): {len(in_minute)} ({shown}); {len(in_minute) * 60 / span:.1f}/min"
        )
    if writes:
        at = [e.at_s - start_s for e in writes]
        lines.append(f"  first {min(at):+.1f}s, last {max(at):+.1f}s; {len(writes)} for {containers} containers")
    others = Counter(describe(e) for e in events if e not in writes)
    if others:
        lines.append(
            "  the agents' other requests meanwhile: " + ", ".join(f"{k} {n}" for k, n in others.most_common())
        )
    shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(deltas.items()) if v) or "none"
    lines.append(f"  the agents' own counters meanwhile: {shown}")
    return lines


def extrapolation_lines(
    steady: Window, baseline: Window, agents: int, restart_lists: int, spread_s: float, violation_writes: int,
    violating_nodes: int, share: float, violation_s: float,
) -> list[str]:  # fmt: skip
    events = agent_requests(steady.audit)
    per_agent_min = Counter(describe(e) for e in events)
    scale_min = 60.0 / steady.seconds / agents
    rows: list[tuple[object, ...]] = []
    for what, n in sorted(per_agent_min.items(), key=lambda kv: -kv[1]):
        per = n * scale_min
        rows.append((f"agents: {what} (steady)", f"{per:.3f}/min", *(f"{per * s / 60:.1f}/s" for s in SCALES)))
    non_watch = sum(n for w, n in per_agent_min.items() if not w.startswith("watch ")) * scale_min
    rows.append(
        ("agents: all but WATCH (steady)", f"{non_watch:.3f}/min", *(f"{non_watch * s / 60:.1f}/s" for s in SCALES))
    )
    watches = steady.last.longrunning
    base_watches = baseline.last.longrunning
    open_per_agent = sum(v - base_watches.get(k, 0.0) for k, v in watches.items() if k[0] == "WATCH") / agents
    rows.append(("agents: open WATCHes", f"{open_per_agent:.2f}", *(f"{open_per_agent * s:.0f}" for s in SCALES)))
    for what, label in (("apiserver", "kube-apiserver CPU"), ("etcd", "etcd CPU")):
        per = (steady.millicores(what) - baseline.millicores(what)) / agents
        rows.append((f"{label} (linear, naive)", f"{per:+.2f}m", *(f"{per * s / 1000:+.2f} cores" for s in SCALES)))
    lists = restart_lists / agents
    rows.append((
        "restart: agents' LISTs", f"{lists:.2f}", *(f"{lists * s:.0f} in {spread_s:.1f}s" for s in SCALES)
    ))  # fmt: skip
    if violating_nodes:
        per_node_min = violation_writes / violating_nodes * 60.0 / violation_s
        rows.append((
            f"violation: Event writes ({share:.0%} of nodes)", f"{per_node_min:.2f}/min per node",
            *(f"{per_node_min * s * share / 60:.1f}/s" for s in SCALES),
        ))  # fmt: skip
    rows.append(("kubelet: Lease PUT (documented)", f"{KUBELET_LEASE_PER_MIN:g}/min", *(
        f"{KUBELET_LEASE_PER_MIN * s / 60:.1f}/s" for s in SCALES)))  # fmt: skip
    rows.append(("kubelet: node status PATCH (documented)", f"{KUBELET_STATUS_PER_MIN:g}/min", *(
        f"{KUBELET_STATUS_PER_MIN * s / 60:.1f}/s" for s in SCALES)))  # fmt: skip
    out = table(("what", "per agent", *(f"{s:,} nodes" for s in SCALES)), rows, (48, 20, 18, 18))
    out += [
        "  (per-agent figures measured here times the node count; the kubelet's are its documented defaults, not",
        "   measured here: a Lease renewal every 10 s, node status every 5 minutes when unchanged. The restart row",
        "   assumes the agents' spread does not grow with the fleet; the CPU rows assume cost linear in agents.)",
    ]
    return out


def plugin_reads(plane: ControlPlane, reads: int, progress: bool) -> tuple[list[PluginRead], list[list[AuditEvent]]]:
    """`reads` reads of every agent as the plugin makes them, one after another; and each read's requests."""
    say(f"the plugin: {reads} reads of every agent's /status", progress)
    done = [read_with_plugin(plane) for _ in range(reads)]
    audited_until_now(plane)
    events = plane.audit_events()
    return done, [plugin_requests(events, r.started_s, r.ended_s) for r in done]


def plugin_lines(done: Sequence[PluginRead], requests: Sequence[Sequence[AuditEvent]], agents: int) -> list[str]:
    times = [r.seconds for r in done]
    median_s = statistics.median(times)
    answered = [r.answered for r in done]
    containers = [sum(1 for row in r.rows if not row.error and row.namespace != "-") for r in done]
    failures = [len(r.failures) for r in done]
    lines = [
        f"  time to a full table: min {min(times):.2f}s, median {median_s:.2f}s, max {max(times):.2f}s "
        f"({', '.join(f'{t:.2f}' for t in times)})",
        f"  agents found: {', '.join(str(r.agents) for r in done)}; answered: {', '.join(map(str, answered))} "
        f"(of {agents} running)",
        f"  rows: {', '.join(str(len(r.rows)) for r in done)}; of them containers: {', '.join(map(str, containers))}, "
        f"rows of an agent without an answer: {', '.join(map(str, failures))}",
    ]
    reasons = Counter(row.error for r in done for row in r.failures)
    if reasons:
        lines.append("  why not: " + "; ".join(f"{why} ({n})" for why, n in reasons.most_common(3)))
    flat = [e for read in requests for e in read]
    counts = Counter(f"{describe(e)} ({e.code})" for e in flat)
    lines.append(f"  requests per read (audit log, user agent {PLUGIN_USER_AGENT}...; verb resource (code)):")
    lines += table(
        ("verb resource", "requests", "per read", "per agent"),
        [(what, n, f"{n / len(done):.2f}", f"{n / len(done) / agents:.3f}") for what, n in counts.most_common()],
        (28, 9, 10, 10),
    )
    lists = [sum(1 for e in read if e.verb == "list") for read in requests]
    proxied = [sum(1 for e in read if e.subresource == "proxy") for read in requests]
    lines.append(f"  each read: LISTs {', '.join(map(str, lists))}; pod-proxy GETs {', '.join(map(str, proxied))}")
    lines.append(
        "  extrapolated (one LIST of the agent pods, a page per 500, and one pod-proxy GET per agent, a read):"
    )
    rows: list[tuple[object, ...]] = [
        ("LIST pods (label selector, all namespaces)", math.ceil(agents / LIST_PAGE),
         *(math.ceil(n / LIST_PAGE) for n in SCALES)),
        ("GET pods/proxy (/status)", agents, *SCALES),
        ("requests per read", math.ceil(agents / LIST_PAGE) + agents, *(math.ceil(n / LIST_PAGE) + n for n in SCALES)),
        (f"time to a full table (linear, naive; {WORKERS} at a time)", f"{median_s:.2f}s",
         *(f"{median_s * n / agents:.0f}s" for n in SCALES)),
    ]  # fmt: skip
    lines += table(("what", f"{agents} agents", *(f"{n:,} nodes" for n in SCALES)), rows, (48, 12, 14, 14))
    lines.append(
        "  (the time assumes each agent's read costs what it cost here and the API server proxies as fast at scale;"
    )
    lines.append("   with --watch, the same requests every --interval)")
    return lines


# -- the run -----------------------------------------------------------------------------------------------------


def describe_agent(fleet: Fleet) -> str:
    env = fleet.agent_env(fleet.nodes[0])
    found = subprocess.run(
        [sys.executable, "-c", "import vramguard; print(vramguard.__file__, vramguard.__version__)"],
        env=env, capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    where = Path(found.split()[0]).parent if found else None
    checkout = where.parents[1] if where is not None else REPO
    head = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=%h %s"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--", "src"], capture_output=True, text=True, check=False
    ).stdout.strip()
    state = f"commit {head[:90]}" + (" with uncommitted changes under src/" if dirty else "") if head else "no git"
    return f"vramguard {found.split()[-1] if found else '?'} from {where} ({state})"


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    progress = not args.quiet
    version = args.kubernetes_version
    dra = serves_dra(version) if args.dra is None else args.dra
    src = args.src.resolve() if args.src else None
    manifest = MANIFEST
    if src is not None and (src.parent / "deploy" / "daemonset.yaml").exists():
        manifest = src.parent / "deploy" / "daemonset.yaml"
    with contextlib.ExitStack() as stack:
        if args.keep:
            tmp = Path(tempfile.mkdtemp(prefix="vramguard-fleet-"))
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vramguard-fleet-")))
        plane = ControlPlane(binaries_dir(version), etcd=args.etcd, audit_log=True, keep_workdir=args.keep)
        stack.callback(plane.stop)
        plane.start()
        api = stack.enter_context(plane.api_client())
        deploy_manifest(api, manifest)
        fleet = Fleet(plane, api, tmp, agent_src=src, poll_interval_s=args.poll_interval, dra=dra)
        stack.callback(fleet.close)
        say(f"building {args.agents} nodes with {args.pods_per_node} pods each", progress)
        t0 = time.monotonic()
        fleet.add_nodes(args.agents, pods_per_node=args.pods_per_node, annotated_share=args.annotated)
        built_s = time.monotonic() - t0
        n = len(fleet.nodes)
        print(f"agent: {describe_agent(fleet)}")
        print(
            f"       vramguard run --mode warn --poll-interval {args.poll_interval:g}"
            + (" --policy <claim:gpu.nvidia.com first>" if dra else "")
            + f"; RBAC and admission policy from {manifest}"
        )
        print(
            f"cluster: kube-apiserver {version} and etcd {etcd_version(args.etcd)} ({watch_progress_note(plane)}), "
            f"audit log at level Metadata; {n} Nodes, {n * args.pods_per_node} pods bound to them "
            f"({args.annotated:.0%} quota'd by annotation, the rest by limits; {QUOTA} each), a GPU process per pod"
            + ("; a ResourceSlice per node" if dra else "")
            + f" (built in {built_s:.0f}s)"
        )
        print(
            f"machine: {os.cpu_count()} cores, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
            f"windows of {args.window:g}s, warm-up {args.warmup:g}s, {args.after_restart:g}s after the restart, "
            f"violation window {args.violation_window:g}s"
        )
        print(f"work directory: {plane.workdir} and {tmp}" if args.keep else "", end="\n" if args.keep else "")
        print(flush=True)

        baseline = measure("baseline", plane, fleet, args.window, progress)

        agents_since_s = time.time()
        say(f"starting {n} agents", progress)
        fleet.start_agents()
        ready_s = fleet.wait_ready(args.ready_timeout)
        say(f"all {n} agents ready after {ready_s:.0f}s; warm-up {args.warmup:g}s", progress)
        time.sleep(args.warmup)
        scans_first = {node.name: node.scans() for node in fleet.nodes}
        steady = measure("steady", plane, fleet, args.window, progress)
        scans_last = {node.name: node.scans() for node in fleet.nodes}
        steady_done = sum(scans_last[k] - scans_first[k] for k in scans_first)
        steady_ratio = steady_done / (n * steady.seconds / args.poll_interval)
        problems = fleet.own_pods_only()

        startup = agent_requests(plane.audit_events(), agents_since_s, steady.first.at_s)
        steady_events = agent_requests(steady.audit)
        print(f"all {n} agents ready {ready_s:.0f}s after their start; every agent keeps to its own pods: "
              + ("yes" if not problems else "NO: " + "; ".join(problems[:3])))  # fmt: skip
        print()
        until_s = steady.first.at_s - agents_since_s
        print(f"== the agents' requests from their start until the steady window ({until_s:.0f}s), per agent:")
        print_lines(table(
            ("verb resource", "requests", "per agent"),
            [(k, v, f"{v / n:.2f}") for k, v in Counter(describe(e) for e in startup).most_common()],
            (28, 9, 10),
        ))  # fmt: skip
        lists = Counter(f"{e.verb} {e.resource} {query(e)}" for e in startup if e.verb in ("list", "watch"))
        print("  LIST and WATCH as asked: " + "; ".join(f"{q}: {c}" for q, c in sorted(lists.items())))
        print()
        print(f"== steady state: the agents' requests in {steady.seconds:.0f}s (audit log, user {AGENT_USER}):")
        print_lines(agent_request_table(steady_events, n, steady.seconds))
        # One line for the fleet: each agent's own node name in its user agent shown as <node>.
        agents_seen = Counter(
            e.user_agent.replace(e.node_name, "<node>") if e.node_name else e.user_agent
            for e in startup + steady_events
        )
        print("  user agents: " + "; ".join(f"{ua!r} ({c})" for ua, c in agents_seen.most_common()))
        expected = n * steady.seconds / args.poll_interval
        print(
            f"  scans: {steady_done:.0f} done, {100 * steady_ratio:.0f}% of the {expected:.0f} the poll interval makes"
        )
        print()
        print("== apiserver_request_total per minute, all clients (a WATCH counts when it ends):")
        print_lines(metrics_table(baseline, steady, n))
        print()
        print("== apiserver_longrunning_requests at the end of each window:")
        print_lines(longrunning_table(baseline, steady))
        print()
        print("== etcd: grpc_server_handled_total:")
        print_lines(etcd_table(baseline, steady))
        print()
        print(f"== CPU, millicores over each window ({baseline.seconds:.0f}s and {steady.seconds:.0f}s):")
        print_lines(cpu_table(baseline, steady, n))
        print()
        print(
            f"== agent-shaped watches (of {fleet.nodes[0].name}, as admin: from a LIST's resourceVersion, bookmarks "
            f"on, a {WATCH_TIMEOUT_S}s timeout; what each received):"
        )
        print_lines(bookmark_lines(baseline.name, baseline.bookmarks) + bookmark_lines(steady.name, steady.bookmarks))
        print(flush=True)

        done, plugin_events = plugin_reads(plane, args.plugin_reads, progress)
        print(
            f"== the plugin: {len(done)} reads as `kubectl vramguard top -A` (in-process, admin kubeconfig): the agent "
            f"pods by label, each agent's /status through the pod proxy, {WORKERS} at a time, merged and rendered:"
        )
        print_lines(plugin_lines(done, plugin_events, n))
        print(flush=True)

        result = restart(plane, fleet, args.after_restart, agents_since_s, progress)
        result.steady_scan_ratio = steady_ratio
        print("== restart of the API server:")
        print_lines(restart_lines(result, n))
        print(flush=True)
        lists_after = sum(1 for e in result.audit if e.verb == "list")
        list_times = [e.at_s for e in result.audit if e.verb == "list"]
        spread = max(list_times) - min(list_times) if list_times else 0.0

        counters_before = fleet_counters(fleet)
        say(f"violation: {args.violating:.0%} of the nodes over their quota", progress)
        violation_start = time.time()
        chosen = fleet.violate(args.violating)
        time.sleep(args.violation_window)
        violation_end = time.time()
        counters_after = fleet_counters(fleet)
        deltas = {k: v - counters_before.get(k, 0.0) for k, v in counters_after.items()}
        violation_events = agent_requests(plane.audit_events(), violation_start, violation_end)
        writes = sum(1 for e in violation_events if e.resource == "events" and e.verb in ("create", "patch", "update"))
        print("== mass violation:")
        containers = sum(len(c.processes) for c in chosen)
        print_lines(violation_lines(
            violation_events, violation_start, violation_end - violation_start, len(chosen), containers, deltas
        ))  # fmt: skip
        print()
        print("== extrapolated:")
        print_lines(extrapolation_lines(
            steady, baseline, n, lists_after, spread, writes, len(chosen), args.violating,
            violation_end - violation_start,
        ))  # fmt: skip
        exited = fleet.exited()
        if exited:
            print(f"\nagents that exited during the run: {', '.join(e.name for e in exited)}")
        say("stopping the agents and the control plane", progress)
    print(f"\n(the whole run took {time.monotonic() - started:.0f}s)")
    return 0


def fleet_counters(fleet: Fleet) -> dict[str, float]:
    """The agents' Event and violation counters, summed over the fleet."""
    totals: dict[str, float] = {}
    for node in fleet.nodes:
        text = node.metrics()
        for labels, value in samples(text, "vramguard_events_total"):
            key = f"events {labels.get('result', '')}"
            totals[key] = totals.get(key, 0.0) + value
        for _, value in samples(text, "vramguard_violations_total"):
            totals["violations"] = totals.get("violations", 0.0) + value
    return totals


def watch_progress_note(plane: ControlPlane) -> str:
    """Whether the API server found etcd able to answer watch progress requests (its log says when not)."""
    log = plane.components["kube-apiserver"].log_path.read_text(errors="replace")
    if "RequestWatchProgress feature is not supported" in log:
        return "no watch progress requests: consistent LISTs are served by etcd, not the watch cache"
    return "watch progress requests supported: consistent LISTs are served by the watch cache"


def etcd_version(etcd: Path | None) -> str:
    out = subprocess.run([etcd or "etcd", "--version"], capture_output=True, text=True, check=False).stdout.split()
    return out[2] if len(out) > 2 else "?"


def print_lines(lines: Iterable[str]) -> None:
    for line in lines:
        print(line)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 3 agents, 10 s windows, 15 s after the restart"
    )
    parser.add_argument("--agents", type=int, default=50, help="nodes, one agent each")
    parser.add_argument("--pods-per-node", type=int, default=3)
    parser.add_argument("--annotated", type=float, default=0.3, help="share of pods quota'd by annotation")
    parser.add_argument("--window", type=float, default=120.0, help="seconds of the baseline and steady windows")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after all agents are ready, not measured")
    parser.add_argument("--after-restart", type=float, default=120.0, help="seconds watched after the restart")
    parser.add_argument("--violating", type=float, default=0.2, help="share of nodes whose pods go over quota")
    parser.add_argument("--violation-window", type=float, default=120.0)
    parser.add_argument("--poll-interval", type=float, default=5.0, help="the agents' --poll-interval")
    parser.add_argument("--src", type=Path, help="run the agents from this checkout's src/ directory")
    parser.add_argument("--kubernetes-version", default=NEWEST)
    parser.add_argument("--etcd", type=Path, help="this etcd binary rather than the one on PATH")
    parser.add_argument(
        "--dra", action=argparse.BooleanOptionalAction, default=None,
        help="ResourceSlices and a claim quota source (default: where the API server serves resource.k8s.io/v1)",
    )  # fmt: skip
    parser.add_argument("--plugin-reads", type=int, default=5, help="reads of every agent by the plugin")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true", help="keep the work directories (audit log, agents' logs)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.pods_per_node, args.window, args.warmup = 3, 2, 10.0, 3.0
        args.after_restart, args.violation_window, args.poll_interval = 15.0, 10.0, 1.0
        args.violating = max(args.violating, 0.34)
        args.plugin_reads = min(args.plugin_reads, 3)
        args.ready_timeout = min(args.ready_timeout, 120.0)
    reason = ("not root" if os.geteuid() != 0 else None) or cgroups_unavailable(version=2)
    reason = reason or unavailable_reason(args.kubernetes_version)
    if reason is not None:
        print(f"bench/fleet.py cannot run here: {reason}", file=sys.stderr)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupted)
    try:
        return run(args)
    except KeyboardInterrupt as e:
        print(
            f"\ninterrupted ({e or 'SIGINT'}); agents, processes, cgroups and the control plane stopped",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
