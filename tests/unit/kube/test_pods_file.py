"""The file-backed pod source: read on its own thread, bounded, loud about faults, and keeping the last good pods."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from unit.kube.test_pod_manifest import BOMB, NODE, POD, UID, as_yaml, pod, pod_list
from vramguard.base.clock import SystemClock
from vramguard.core.model import MiB, Policy
from vramguard.core.quota import resolve_pod_quota
from vramguard.kube.pods_file import MAX_VALUE_CHARS, FilePodSource, parse_pod_list
from vramguard_testbed.waiting import wait_until

THREAD = "vramguard-pods-file"
Start = Callable[..., FilePodSource]


@pytest.fixture
def start() -> Iterator[Start]:
    """start(path, **kwargs) -> a started FilePodSource checking every 10 ms; each is stopped after the test."""
    sources: list[FilePodSource] = []

    def make(path: Path, **kwargs: Any) -> FilePodSource:
        source = FilePodSource(str(path), **{"check_interval_s": 0.01, **kwargs})
        source.start()
        sources.append(source)
        return source

    yield make
    for source in sources:
        source.stop(time.monotonic() + 1)


class CountingClock(SystemClock):
    """The system clock, counting the source's waits: the thread waits once after each check of the file."""

    def __init__(self) -> None:
        self.waits = 0

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        self.waits += 1
        return super().wait(stop, seconds)

    def checks(self, n: int) -> None:
        """Return once the source has checked the file `n` more times."""
        until = self.waits + n + 1  # the check under way may have begun before the call
        wait_until(lambda: self.waits >= until, what=f"{n} more checks of the file")


def write(path: Path, data: bytes) -> None:
    """Replace the file atomically, as kubectl > tmp && mv would."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


POD_YAML = """\
- apiVersion: v1
  kind: Pod
  metadata:
    annotations:
      kubectl.kubernetes.io/restartedAt: "2026-11-22T10:00:00Z"
      prometheus.io/scrape: "true"
      vramguard.io/vram-limit: 8Gi
    creationTimestamp: "2026-11-22T10:00:00Z"
    generateName: job-
    labels: {{app: trainer, pod-template-hash: 7d9f8c6b5, team: team-{team}}}
    name: job-{i}
    namespace: team-{team}
    ownerReferences:
    - {{apiVersion: apps/v1, blockOwnerDeletion: true, controller: true, kind: ReplicaSet, name: job-7d9f8c6b5, uid: r}}
    resourceVersion: "{i}"
    uid: uid-{i}
  spec:
    containers:
    - args: [--epochs, "10"]
      command: [python, train.py]
      env:
      - {{name: RANK, value: "{i}"}}
      image: nvcr.io/nvidia/pytorch:24.01-py3
      name: main
      resources:
        limits: {{cpu: "4", memory: 16Gi, nvidia.com/gpu: "1", vramguard.io/vram: 8Gi}}
        requests: {{cpu: "2", memory: 8Gi}}
      volumeMounts:
      - {{mountPath: /data, name: data}}
    - command: [sh, -c, sleep infinity]
      image: busybox:1.36
      name: sidecar
      resources:
        limits: {{cpu: 100m, memory: 64Mi}}
    nodeName: gpu-1
    priority: 1000
    tolerations:
    - {{effect: NoSchedule, key: nvidia.com/gpu, operator: Exists}}
  status:
    conditions:
    - {{lastTransitionTime: "2026-11-22T10:00:00Z", status: "True", type: Ready}}
    containerStatuses:
    - {{containerID: "containerd://{i:064x}", image: img, name: main, ready: true, restartCount: 0}}
    - {{containerID: "containerd://{j:064x}", image: img, name: sidecar, ready: true, restartCount: 0}}
    phase: Running
    qosClass: Burstable
"""


def many_pods_yaml(n: int) -> bytes:
    """A kubectl-shaped list of `n` realistic pods, written from a template (yaml.dump would take seconds)."""
    pods = "".join(POD_YAML.format(i=i, j=i + n, team=i % 20) for i in range(n))
    return f"apiVersion: v1\nitems:\n{pods}kind: List\nmetadata:\n  resourceVersion: ''\n".encode()


# --------------------------------------------------------------------------------------------------------------


def test_nothing_is_read_before_start(tmp_path: Path) -> None:
    """Construction touches no file and starts no thread: not synced, no pods, and problem() says why."""
    source = FilePodSource(str(tmp_path / "no" / "such" / "pods.yaml"))
    assert not source.synced() and source.pods() == {} and source.node_labels() == {}
    assert source.problem() == f"pods file {tmp_path}/no/such/pods.yaml: not read yet"
    assert THREAD not in [t.name for t in threading.enumerate()]
    source.stop(time.monotonic())  # stopping one never started is harmless


def test_first_read_happens_on_the_thread(tmp_path: Path, start: Start) -> None:
    """start() returns at once, before the first read (of 1,000 pods) is done; wait_synced() waits for it."""
    path = tmp_path / "pods.yaml"
    write(path, many_pods_yaml(1000))
    started = time.monotonic()
    source = start(path)
    assert time.monotonic() - started < 0.1
    assert not source.synced() and source.pods() == {}
    assert source.problem() == f"pods file {path}: not read yet"
    assert source.wait_synced(10)
    assert len(source.pods()) == 1000 and source.problem() is None


def test_serves_this_nodes_pods_and_labels(tmp_path: Path, start: Start) -> None:
    """Only the pods bound to this node are served, and this Node's labels."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD, pod("other", node="gpu-2"), NODE)))
    source = start(path, node_name="gpu-1")
    assert source.wait_synced(5)
    assert source.synced() and source.problem() is None
    assert list(source.pods()) == [UID]
    assert source.node_labels() == {"nvidia.com/gpu.replicas": "4"}


def test_missing_file_is_not_synced_until_it_appears(tmp_path: Path, start: Start) -> None:
    """No file yet: not synced, no pods, and problem() says so; the file appearing syncs the source."""
    path = tmp_path / "pods.yaml"
    source = start(path)
    wait_until(lambda: "No such file or directory" in (source.problem() or ""), what="the missing file's problem")
    assert not source.synced() and source.pods() == {}
    write(path, as_yaml(pod_list(POD)))
    assert source.wait_synced(5) and source.problem() is None and list(source.pods()) == [UID]


def test_unchanged_file_is_not_parsed_again(tmp_path: Path, start: Start) -> None:
    """Each check is a stat: the file is parsed again only when its identity (inode, mtime, size) changes."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    clock = CountingClock()
    source = start(path, clock=clock)
    assert source.wait_synced(5)
    clock.checks(10)
    assert source.reads == 1
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    wait_until(lambda: source.reads == 2, what="the second read")


def test_rewrite_follows_changes(tmp_path: Path, start: Start) -> None:
    """A rewritten file is picked up: pods added and removed."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    source = start(path)
    assert source.wait_synced(5)
    write(path, as_yaml(pod_list()))
    wait_until(lambda: source.pods() == {}, what="no pods")
    write(path, as_yaml(pod_list(POD, pod("second"))))
    wait_until(lambda: sorted(source.pods()) == sorted([UID, "second"]), what="both pods")


def _replace_with_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        pytest.param(
            lambda p: p.write_bytes(b"items: [ {unclosed"),
            r"line \d+, column \d+: did not find expected",
            id="half-written",
        ),
        pytest.param(lambda p: p.write_bytes(b""), r"got nothing", id="truncated-to-empty"),
        pytest.param(
            lambda p: p.write_bytes(b"apiVersion: v1\nitems:"), r"items: has no value", id="cut-right-after-items"
        ),
        pytest.param(
            lambda p: p.write_bytes(BOMB), r"line 1: YAML anchors and aliases are not allowed", id="alias-bomb"
        ),
        pytest.param(
            lambda p: p.write_bytes(as_yaml(pod_list({"metadata": {"name": "x", "namespace": "ml"}}))),
            r"items\[0\]: pod ml/x: metadata\.uid is missing",
            id="pod-without-uid",
        ),
        pytest.param(lambda p: p.write_bytes(b"#" * 70_000), r"68.4KiB is over the 64.0KiB bound", id="over-the-bound"),
        pytest.param(Path.unlink, r"No such file or directory", id="deleted"),
        pytest.param(_replace_with_directory, r"not a regular file", id="replaced-by-a-directory"),
    ],
)
def test_fault_keeps_last_good_pods_says_why_then_recovers(
    tmp_path: Path, start: Start, spoil: Callable[[Path], object], problem: str
) -> None:
    """A file that turns bad keeps the last good pods and problem() names the fault; a good file clears it."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD, NODE)))
    source = start(path, node_name="gpu-1", max_bytes=64 * 1024)
    assert source.wait_synced(5)
    good = source.pods()

    spoil(path)
    wait_until(lambda: source.problem() is not None, what="a problem")
    said = source.problem() or ""
    assert said.startswith(f"pods file {path}: ") and re.search(problem, said), said
    assert source.pods() is good and source.synced()
    assert source.node_labels() == {"nvidia.com/gpu.replicas": "4"}

    if path.is_dir():
        path.rmdir()
    write(path, as_yaml(pod_list(pod("new"))))
    wait_until(lambda: source.problem() is None, what="the recovery")
    assert list(source.pods()) == ["new"]


def test_each_fault_is_logged_once_and_the_recovery_once(tmp_path: Path, start: Start) -> None:
    """However many checks see a fault, it is logged once; a different fault once more; the recovery once."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    clock = CountingClock()
    with capture_logs() as logs:
        source = start(path, clock=clock)
        assert source.wait_synced(5)
        path.unlink()
        wait_until(lambda: "No such file" in (source.problem() or ""), what="the missing file's problem")
        clock.checks(10)  # of the missing file
        write(path, BOMB)
        wait_until(lambda: "anchors" in (source.problem() or ""), what="the alias bomb's problem")
        clock.checks(10)
        write(path, as_yaml(pod_list(POD)))
        wait_until(lambda: source.problem() is None, what="the recovery")
        clock.checks(5)
    events = [(e["event"], e.get("error", "")) for e in logs if e["event"].startswith("pods_file")]
    assert [e for e, _ in events] == [
        "pods_file_synced",
        "pods_file_unreadable",
        "pods_file_unreadable",
        "pods_file_recovered",
    ]
    assert "No such file or directory" in events[1][1] and "line 1: YAML anchors" in events[2][1]
    assert all(e["log_level"] == "warning" for e in logs if e["event"] == "pods_file_unreadable")


def test_alias_bomb_is_refused_fast_and_last_good_pods_kept(tmp_path: Path, start: Start) -> None:
    """A 589-byte 'billion laughs' costs less than a second and no memory: refused at line 1, pods kept."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    source = start(path)
    assert source.wait_synced(5)
    write(path, BOMB)
    written = time.monotonic()
    wait_until(lambda: source.problem() is not None, timeout_s=1.0, what="the bomb refused")
    assert time.monotonic() - written < 1.0
    assert "line 1: YAML anchors and aliases are not allowed" in (source.problem() or "")
    assert list(source.pods()) == [UID]


def test_oversized_file_is_refused_before_reading(tmp_path: Path, start: Start) -> None:
    """A file over the default 64 MiB bound is refused by its size (a sparse 80 MiB file: nothing is read)."""
    path = tmp_path / "pods.yaml"
    with open(path, "wb") as f:
        f.truncate(80 * MiB)
    source = start(path)
    wait_until(lambda: "bound" in (source.problem() or ""), what="the bound's problem")
    assert source.problem() == f"pods file {path}: 80.0MiB is over the 64.0MiB bound"
    assert not source.synced()


def test_file_longer_than_its_size_is_bounded_while_reading(start: Start) -> None:
    """The bound holds while reading too: a file whose size says 0 (a /proc file) is cut off at the bound."""
    source = start(Path("/proc/self/maps"), max_bytes=64)  # regular, size 0, kilobytes long
    wait_until(lambda: "bound" in (source.problem() or ""), what="the bound's problem")
    assert source.problem() == "pods file /proc/self/maps: grew over the 64B bound while being read"


def test_huge_annotation_is_bounded_in_pod_info(tmp_path: Path, start: Start) -> None:
    """Of two 10 MB annotations PodInfo keeps 1024 characters of the quota one only, and that quota is invalid."""
    path = tmp_path / "pods.yaml"
    doc = as_yaml(pod_list(pod(UID, annotations={"vramguard.io/vram-limit": "HUGE", "notes": "HUGE"})))
    write(path, doc.replace(b"HUGE", b"1" * 10_000_000))
    source = start(path)
    assert source.wait_synced(10)
    p = source.pods()[UID]
    assert list(p.annotations) == ["vramguard.io/vram-limit"]
    assert len(p.annotations["vramguard.io/vram-limit"]) == MAX_VALUE_CHARS
    assert p.annotations["vramguard.io/vram-limit"].endswith("[cut: 10000000 characters]")
    errors = resolve_pod_quota(p, Policy(), source.node_labels()).errors
    assert [e.field for e in errors] == ["metadata.annotations[vramguard.io/vram-limit]"]


def test_rewrite_of_a_large_file_does_not_stall_pods(tmp_path: Path, start: Start) -> None:
    """While 1,000 rewritten pods are parsed, each pods() call returns the old pods in < 5 ms, then all new ones."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    source = start(path)
    assert source.wait_synced(5)
    old = source.pods()
    write(path, many_pods_yaml(1000))  # about 2.5 MB: parsing takes the thread a second or so
    durations, deadline = [], time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.001)  # as a scan loop does between scans
        t0 = time.perf_counter()
        pods = source.pods()
        durations.append(time.perf_counter() - t0)
        if pods is not old:
            break
        assert pods == old
    assert len(pods) == 1000 and source.problem() is None
    assert len(durations) > 20, "the parse should have overlapped the loop"
    assert max(durations) < 0.005


def test_stop_returns_by_its_deadline_even_mid_parse(tmp_path: Path) -> None:
    """stop(deadline) returns by its deadline, also while a large file is being parsed: that parse, which cannot be
    interrupted, is dropped when it ends, and the thread ends with it."""
    path = tmp_path / "pods.yaml"
    write(path, many_pods_yaml(1000))
    source = FilePodSource(str(path))
    source.start()
    assert THREAD in [t.name for t in threading.enumerate()]
    wait_until(lambda: source.reads == 1, what="the parse to begin")  # it takes a second or more
    started = time.monotonic()
    source.stop(started + 0.2)
    assert time.monotonic() - started < 1.0
    wait_until(lambda: THREAD not in [t.name for t in threading.enumerate()], timeout_s=60, what="the thread to end")
    assert not source.synced() and source.pods() == {}


def test_the_file_s_claims_and_this_node_s_slices_give_dra_shares() -> None:
    """ResourceClaims and ResourceSlices ride in the pods file; another node's slice is not this node's GPU."""

    def slice_of(node: str, uuid: str) -> str:
        return f"""
- kind: ResourceSlice
  metadata: {{name: {node}-gpus}}
  spec:
    driver: gpu.nvidia.com
    nodeName: {node}
    pool: {{name: {node}}}
    devices: [{{name: gpu-0, attributes: {{uuid: {{string: {uuid}}}}}}}]"""

    def claim(name: str, pool: str) -> str:
        return f"""
- kind: ResourceClaim
  metadata: {{name: {name}, namespace: ml, uid: u-{name}}}
  status:
    allocation:
      devices:
        results:
        - {{request: gpu, driver: gpu.nvidia.com, pool: {pool}, device: gpu-0, consumedCapacity: {{memory: 10Gi}}}}"""

    def pod(name: str, claim_name: str) -> str:
        return f"""
- kind: Pod
  metadata: {{name: {name}, namespace: ml, uid: {name}-uid}}
  spec:
    nodeName: node-a
    resourceClaims: [{{name: gpu, resourceClaimName: {claim_name}}}]
    containers: [{{name: main, resources: {{claims: [{{name: gpu}}]}}}}]"""

    text = "kind: List\nitems:" + "".join(
        [slice_of("node-a", "GPU-a"), slice_of("node-b", "GPU-b"), claim("here", "node-a"), claim("there", "node-b"),
         pod("p", "here"), pod("q", "there")]
    )  # fmt: skip
    parsed = parse_pod_list(text.encode(), "node-a")
    ((share,),) = parsed.shares["p-uid"].values()
    assert (share.gpu_uuid, share.bytes, share.error) == ("GPU-a", 10 * 2**30, None)
    ((elsewhere,),) = parsed.shares["q-uid"].values()
    assert elsewhere.error is not None and elsewhere.error.message == "is in no ResourceSlice of this node"
