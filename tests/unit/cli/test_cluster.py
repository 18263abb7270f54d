"""Where pods come from and Events and evictions go, built without starting anything: the pods file with the log
and a failing evictor, and what the API server side needs before it is asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from unit.cli.test_config import config
from vramguard.agent.metrics import Metrics
from vramguard.agent.watch import ScanCalls
from vramguard.cli.cluster import capacity_publisher, connect, scan_calls
from vramguard.cli.config import WiringError
from vramguard.core.policy import Policy
from vramguard.kube.no_api import LogEventRecorder, NoApiEvictor
from vramguard.kube.pods_file import FilePodSource
from vramguard_testbed.fakes import FakeClock


def test_a_pods_file_means_no_api_server(tmp_path: Path) -> None:
    """`--pods-file`: the file's pods, Events in the log, evictions failing; the kubelet's word and the file read
    as background parts (not started), in that order; no capacity to publish."""
    setup = config(pods_file=tmp_path / "pods.yaml").scan
    cluster = connect(setup, Metrics(), FakeClock())
    assert isinstance(cluster.pods, FilePodSource)
    assert isinstance(cluster.events, LogEventRecorder) and isinstance(cluster.evictor, NoApiEvictor)
    assert [name for name, _ in cluster.parts] == ["kubelet-pods", "pods-file"]
    assert cluster.api is None and cluster.claims is None
    assert isinstance(cluster.scan_calls, ScanCalls), "the watch's calls, handed to the pod source too"
    assert capacity_publisher(cluster, "node-1", 0, True, False, FakeClock()) is None


def test_the_api_server_needs_the_nodes_name() -> None:
    """Without --node-name there is no way to watch this node's pods: the start stops, saying so."""
    with pytest.raises(WiringError, match="--node-name"):
        connect(config(node_name=None).scan, Metrics(), FakeClock())


def test_without_a_watch_no_scan_is_called_for_between_polls() -> None:
    """`watch_interval: 0s`: no calls for scans, so a pod update calls for none either."""
    assert scan_calls(Policy(watch_interval_s=0.0), Metrics(), FakeClock()) is None
    assert isinstance(scan_calls(Policy(), Metrics(), FakeClock()), ScanCalls)
