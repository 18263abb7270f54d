"""The pods file source on a real thread and the system clock, with real sizes: it starts without waiting for a
large file's parse, serves the old pods while a rewrite is parsed, stops by its deadline mid-parse, refuses an
alias bomb at once, and parses many pods in memory bounded by the file's size."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from unit.core.test_documents import BOMB
from unit.kube.test_pod_manifest import POD, UID
from unit.kube.test_pods_file import as_yaml, pod, pod_list, write
from vramguard.core.policy import Policy
from vramguard.core.quota import resolve_pod_quota
from vramguard.kube.pod_manifest import MAX_VALUE_CHARS, PodSourceError
from vramguard.kube.pods_file import FilePodSource, parse_pod_list
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


def test_rewrite_of_a_large_file_does_not_stall_pods(tmp_path: Path, start: Start) -> None:
    """While 1,000 rewritten pods are parsed, pods() returns the old pods call after call without waiting for the
    parse (counted: at least 20 calls while it runs), then all new ones."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    source = start(path)
    assert source.wait_synced(5)
    old = source.pods()
    write(path, many_pods_yaml(1000))  # about 2.5 MB: parsing takes the thread a second or so
    wait_until(lambda: source.reads == 2, what="the parse of the rewrite to begin")
    served_old, slowest_s, deadline = 0, 0.0, time.monotonic() + 30
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        pods = source.pods()
        slowest_s = max(slowest_s, time.perf_counter() - t0)
        if pods is not old:
            break
        assert pods == old
        served_old += 1
        time.sleep(0.001)  # as a scan loop does between scans
    print(f"pods() during a 1,000-pod parse: {served_old} calls served the old pods, the slowest in {slowest_s:.4f} s")
    assert len(pods) == 1000 and source.problem() is None
    assert served_old >= 20, "pods() waited for the parse: a stall would serve the new pods at its first call"


def test_stop_returns_by_its_deadline_even_mid_parse(tmp_path: Path) -> None:
    """stop(deadline) returns by its deadline, also while a large file is being parsed: that parse, which cannot be
    interrupted, is dropped when it ends, and the thread ends with it."""
    path = tmp_path / "pods.yaml"
    write(path, many_pods_yaml(1000))
    before = set(threading.enumerate())
    source = FilePodSource(str(path))
    source.start()
    (thread,) = [t for t in set(threading.enumerate()) - before if t.name == THREAD]
    wait_until(lambda: source.reads == 1, what="the parse to begin")  # it takes a second or more
    started = time.monotonic()
    source.stop(started + 0.2)
    assert time.monotonic() - started < 1.0
    wait_until(lambda: not thread.is_alive(), timeout_s=60, what="the thread to end")
    assert not source.synced() and source.pods() == {}


def test_alias_bomb_is_refused_before_anything_is_expanded() -> None:
    """The 'billion laughs' (a billion strings once expanded) is refused in well under a second."""
    started = time.monotonic()
    with pytest.raises(PodSourceError, match="line 1"):
        parse_pod_list(BOMB)
    assert time.monotonic() - started < 0.1


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


def test_yaml_items_are_let_go_as_each_is_read() -> None:
    """A YAML list's items are translated as each is read and their nodes let go (a node costs tens of times its
    text): 200 pods parse in less memory than four times the file."""
    data = as_yaml(pod_list(*[pod(f"uid-{i}") for i in range(200)]))
    tracemalloc.start()
    try:
        assert len(parse_pod_list(data).pods) == 200
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(data), f"{peak} bytes to parse {len(data)}"


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
