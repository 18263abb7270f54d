"""A fleet of real agents on a real API server that keeps an audit log: what each agent asks once it is ready.

Three real `vramguard run` agents (tests/cluster/fleet.py: each its own Node, pods, test NVML state and
token bound to its pod on that node), on a control plane of their own, since the session's keeps no audit log.
In steady state an agent's only requests are WATCH renewals: its pods, its Node and its ResourceSlices reach it
through watches, so a fleet of thousands costs the API server no periodic read. The plugin (kubectl-vramguard)
reads every agent's /status with one LIST and one pod-proxy GET per agent. And bench/fleet.py stays runnable.

The fleet's tests are a class, so that the fleet is gone before the benchmark's test starts its own (two fleets at
once would measure each other). The fleet's pod cgroups are the systemd driver's (kubepods.slice), which the real
node's kubelet (cgroupfs driver: /kubepods) never looks at, so the module runs beside the real-node tests.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups
from real_parts import need
from vramguard_testbed.waiting import wait_until

from .controlplane import NEWEST, AuditEvent, ControlPlane, serves_dra, unavailable_reason
from .fleet import (
    WORKLOAD_NAMESPACE,
    Fleet,
    agent_requests,
    audited_until_now,
    describe,
    plugin_requests,
    read_with_plugin,
)
from .kube_fixtures import deploy_manifest

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fleet.py"
AGENTS = 3
POLL_S = 1.0
WARMUP_S = 5.0  # after every agent is ready: start-up requests still in flight are not steady state
# Longer than a periodic request every 5 s (with jitter) would leave empty, so any periodic read shows up.
WINDOW_S = 20.0


@dataclass(frozen=True)
class RunningFleet:
    plane: ControlPlane
    fleet: Fleet
    started_s: float  # when the agents were started (time.time(), the audit log's clock)
    ready_s: float  # when every agent was ready


@pytest.fixture(scope="class")
def running_fleet(
    control_plane_binaries: Path, kubernetes_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningFleet]:
    """Three ready agents, each on its own node with two pods, on a control plane with an audit log; with DRA
    where the API server serves it (a ResourceSlice per node, claims read first)."""
    need_cgroups(2)
    plane = ControlPlane(control_plane_binaries, audit_log=True).start()
    try:
        with plane.api_client() as api:
            deploy_manifest(api)
            fleet = Fleet(
                plane,
                api,
                tmp_path_factory.mktemp("fleet"),
                poll_interval_s=POLL_S,
                dra=serves_dra(kubernetes_version),
            )
            try:
                fleet.add_nodes(AGENTS, pods_per_node=2)
                started_s = time.time()
                fleet.start_agents()
                fleet.wait_ready(timeout_s=120)
                yield RunningFleet(plane, fleet, started_s, time.time())
            finally:
                fleet.close()
    finally:
        plane.stop()


def summary(events: list[AuditEvent]) -> str:
    counts = Counter(f"{describe(e)} ({e.code})" for e in events)
    first = events[0]
    return (
        ", ".join(f"{what} x{n}" for what, n in counts.most_common())
        + f"; e.g. {first.verb} {first.request_uri} from node {first.node_name}, user agent {first.user_agent!r}"
    )


class TestSteadyState:
    """Three agents, ready: what they ask the API server from then on."""

    def test_agents_make_no_request_but_watch_renewals_in_steady_state(self, running_fleet: RunningFleet) -> None:
        """In 20 s after every agent is ready (each scanning all along), the agents send no GET, LIST or write: only
        WATCH requests, if any."""
        plane, fleet = running_fleet.plane, running_fleet.fleet
        wait_until(
            lambda: time.time() >= running_fleet.ready_s + WARMUP_S,
            WARMUP_S + 1,
            what="the warm-up after every agent is ready",
            interval_s=0.1,
        )
        scans_before = {node.name: node.scans() for node in fleet.nodes}
        start_s = time.time()

        def scanned() -> dict[str, float]:
            return {node.name: node.scans() - scans_before[node.name] for node in fleet.nodes}

        # The window is over once 20 s have passed and every agent has scanned through them (it was alive and
        # working, not stalled).
        enough = WINDOW_S / POLL_S * 0.75
        wait_until(
            lambda: time.time() >= start_s + WINDOW_S and all(n >= enough for n in scanned().values()),
            WINDOW_S * 3,
            what="the window to pass with every agent scanning through it",
            interval_s=0.5,
        )
        end_s = audited_until_now(plane)
        # A request received before end_s is logged once answered: a second marker, answered after the first, lets
        # one still being answered then (a GET or LIST from the watch cache takes milliseconds) reach the log.
        audited_until_now(plane)
        events = plane.audit_events()
        # The filter finds the agents: each one's pod watch since its start, under its own node's name.
        watching = {
            e.node_name
            for e in agent_requests(events, running_fleet.started_s)
            if e.verb == "watch" and e.resource == "pods"
        }
        assert watching == {node.name for node in fleet.nodes}, f"pod watches seen for {watching}"

        steady = agent_requests(events, start_s, end_s)
        offending = [e for e in steady if e.verb != "watch"]
        if offending:  # pytest.fail: the message alone, without the events' repr an assert adds
            pytest.fail(
                f"in {end_s - start_s:.0f}s of steady state the agents made {len(offending)} requests other than "
                f"WATCH: {summary(offending)}"
            )

    def test_agents_name_themselves_and_their_node_in_the_user_agent(self, running_fleet: RunningFleet) -> None:
        """Every request an agent made since its start has a user agent `vramguard/<version> ...` that names its
        node as the word `node/<its node>`, so the API server's audit log and metrics can tell the agents, and each
        agent's node, apart."""
        events = agent_requests(running_fleet.plane.audit_events(), running_fleet.started_s)
        assert events, "no request from the agents in the audit log"

        def named(e: AuditEvent) -> bool:
            words = e.user_agent.replace("(", " ").replace(")", " ").split()
            return e.user_agent.startswith("vramguard/") and f"node/{e.node_name}" in words

        wrong = [e for e in events if not named(e)]
        if wrong:
            pytest.fail(f"{len(wrong)} of {len(events)} requests without the agent's user agent: {summary(wrong)}")

    def test_plugin_reads_every_agent_with_one_list_and_a_proxy_get_each(self, running_fleet: RunningFleet) -> None:
        """The plugin's read (in-process, as `kubectl vramguard top -A`) finds the three agent pods, and its merged
        table has every agent's containers and no failure row; it asked the API server one pods LIST and one pods/proxy
        GET per agent pod, no more."""
        plane, fleet = running_fleet.plane, running_fleet.fleet
        # A scan by every agent since its /readyz said its pod list is current: ready only says some scan completed,
        # and one from before the pod list synced leaves the pods' memory unattributed.
        before = {node.name: node.scans() for node in fleet.nodes}
        wait_until(
            lambda: all(node.scans() > before[node.name] for node in fleet.nodes),
            30,
            what="a scan by every agent since it was ready",
            interval_s=0.2,
        )
        read = read_with_plugin(plane)
        end_s = audited_until_now(plane)
        assert read.failures == [], read.table
        assert (read.agents, read.answered) == (AGENTS, AGENTS), read.table
        expected = {
            (node.name, WORKLOAD_NAMESPACE, proc.pod.name, "main")
            for node in fleet.nodes
            for proc in node.processes
            if proc.pod is not None
        }
        assert {(r.node, r.namespace, r.pod, r.container) for r in read.rows} == expected, read.table

        requests = plugin_requests(plane.audit_events(), read.started_s, end_s)
        assert Counter(f"{describe(e)} ({e.code})" for e in requests) == {
            "list pods (200)": 1,
            "get pods/proxy (200)": AGENTS,
        }, summary(requests)
        proxied = sorted(e.name.split(":")[0] for e in requests if e.subresource == "proxy")  # name:port
        assert proxied == sorted(f"vramguard-agent-{node.name}" for node in fleet.nodes), summary(requests)


def run_bench(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """bench/fleet.py with `args`. Past `timeout_s` it gets SIGTERM, on which it stops its agents, the pods'
    processes and cgroups and its control plane (subprocess.run's SIGKILL would leave the processes in kubepods
    cgroups), then SIGKILL a minute later; and the test fails."""
    with subprocess.Popen(
        [sys.executable, str(BENCH), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as bench:
        try:
            out, err = bench.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            bench.terminate()
            try:
                out, err = bench.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                bench.kill()
                out, err = bench.communicate()
            pytest.fail(f"bench/fleet.py ran past {timeout_s:.0f}s; its output ends:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(bench.args, bench.returncode, out, err)


def test_quick_fleet_benchmark_prints_its_tables() -> None:
    """`bench/fleet.py --quick` (3 agents, short windows) prints every section: the agents' requests, the API
    server's counts and CPU against the baseline, the plugin's reads, the restart, the mass violation and the
    extrapolation."""
    need_cgroups(2)
    need(unavailable_reason(NEWEST), skip="no Kubernetes control plane", ci="build the Kubernetes control plane first")
    result = run_bench("--quick", "--quiet", timeout_s=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for heading in (
        "== steady state: the agents' requests",
        "== apiserver_request_total per minute, all clients",
        "== apiserver_longrunning_requests at the end of each window:",
        "== etcd: grpc_server_handled_total:",
        "== CPU, millicores over each window",
        "== the plugin: 3 reads as `kubectl vramguard top -A`",
        "  time to a full table: min ",
        "== restart of the API server:",
        "the agents' LISTs: ",
        "watching again (audit log)",
        "scans from the stop to the end",
        "== mass violation:",
        "== extrapolated:",
    ):
        assert heading in out, f"{heading!r} missing from:\n{out}"
    lines = out.splitlines()
    # Every read found and heard from the three agents, with one LIST and three pod-proxy GETs.
    assert "  agents found: 3, 3, 3; answered: 3, 3, 3 (of 3 running)" in lines, out
    assert "  each read: LISTs 1, 1, 1; pod-proxy GETs 3, 3, 3" in lines, out
    assert any(line.startswith("all 3 agents ready ") and line.endswith("own pods: yes") for line in lines), out
    assert any(line.split()[:1] == ["kube-apiserver"] and line.split()[1].endswith("m") for line in lines), out
    assert any(line.strip().startswith("kubelet: Lease PUT (documented)") for line in lines), out
    # The violating nodes' containers each got their Warning: a create for each, in the audit log.
    violation = next(line for line in lines if "containers over their quota" in line)
    containers = int(violation.split(" nodes, ")[1].split()[0])
    assert any(line.strip().startswith("first ") and f" for {containers} containers" in line for line in lines), out
