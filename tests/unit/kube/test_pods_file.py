"""The pods file: kubectl's YAML and JSON parsed under `documents`' rules, and the source that re-reads it on its
loop, loud about faults and keeping the last good pods. Rounds run on the test's thread, paced by a FakeClock."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

from unit.core.test_documents import BOMB
from unit.kube.test_pod_manifest import POD, UID
from vramguard.core.documents import YAML_PARSERS
from vramguard.core.quantity import MiB
from vramguard.kube.pod_manifest import PodSourceError
from vramguard.kube.pods_file import FilePodSource, parse_pod_list
from vramguard_testbed.fakes import FakeClock, FakeKubeletPods

NODE: dict[str, Any] = {"kind": "Node", "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.replicas": "4"}}}


def pod(uid: str, node: str = "gpu-1", **metadata: Any) -> dict[str, Any]:
    """POD with another UID (and node, and metadata fields)."""
    return {**POD, "metadata": {**POD["metadata"], "uid": uid, **metadata}, "spec": {**POD["spec"], "nodeName": node}}


def pod_list(*items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "items": list(items), "kind": "List", "metadata": {"resourceVersion": ""}}


def as_yaml(doc: object) -> bytes:
    # Through JSON first: safe_dump writes an anchor and aliases for objects shared in the document, and
    # kubectl never does (nor would a pods file be accepted with them).
    return yaml.dump(json.loads(json.dumps(doc)), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)).encode()


def as_json(doc: object) -> bytes:
    return json.dumps(doc, indent=4).encode()  # as kubectl prints it


# --------------------------------------------------------------------------------------------------------------
# Parsing


@pytest.mark.parametrize(
    ("data", "node_name", "uids", "labels"),
    [
        pytest.param(as_yaml(pod_list(POD, NODE)), "gpu-1", [UID], {"nvidia.com/gpu.replicas": "4"}, id="kubectl-yaml"),
        pytest.param(as_json(pod_list(POD, NODE)), "gpu-1", [UID], {"nvidia.com/gpu.replicas": "4"}, id="kubectl-json"),
        pytest.param(b"\xef\xbb\xbf" + as_json(pod_list(POD)), None, [UID], {}, id="json-with-byte-order-mark"),
        pytest.param(as_yaml({**pod_list(POD), "kind": "PodList"}), None, [UID], {}, id="api-server-podlist"),
        pytest.param(
            as_yaml(pod_list(POD, pod("other", node="gpu-2"))), "gpu-1", [UID], {}, id="other-nodes-pods-left-out"
        ),
        pytest.param(
            as_yaml(pod_list(POD, pod("other", node="gpu-2"))), None, [UID, "other"], {}, id="no-node-name-all-pods"
        ),
        pytest.param(
            as_yaml(pod_list(POD, {**NODE, "metadata": {**NODE["metadata"], "name": "gpu-2"}})),
            "gpu-1",
            [UID],
            {},
            id="another-nodes-labels-left-out",
        ),
        pytest.param(as_yaml(POD), "gpu-1", [UID], {}, id="a-single-pod"),
        pytest.param(as_json(NODE), "gpu-1", [], {"nvidia.com/gpu.replicas": "4"}, id="a-single-node"),
        pytest.param(b"apiVersion: v1\nitems: []\nkind: List\n", None, [], {}, id="no-pods"),
        pytest.param(b'{"items": [], "kind": "List"}', None, [], {}, id="json-no-pods"),
    ],
)
def test_pod_lists_parse(data: bytes, node_name: str | None, uids: list[str], labels: dict[str, str]) -> None:
    """kubectl's YAML and JSON, the API's PodList, one Pod or Node: the pods of this node and its labels."""
    parsed = parse_pod_list(data, node_name)
    assert sorted(parsed.pods) == sorted(uids)
    assert dict(parsed.node_labels) == labels


def test_yaml_scalars_are_typed_as_kubectl_means_them() -> None:
    """Plain true/false, null and integers are typed (the owner's `controller: true`); other scalars stay text."""
    text = f"""\
items:
- metadata:
    uid: {UID}
    ownerReferences: [{{kind: Job, name: j, controller: true}}]
    deletionTimestamp: null
  spec:
    priority: 2000
    containers: [{{name: main, resources: {{limits: {{vramguard.io/vram: 1.50, nvidia.com/gpumem: 0x10}}}}}}]
"""
    for parser in YAML_PARSERS:
        p = parse_pod_list(text.encode(), yaml_parser=parser).pods[UID]
        assert (p.owner, p.terminating, p.priority) == ("Job/j", False, 2000)
        assert dict(p.containers[0].limits) == {"vramguard.io/vram": "1.50", "nvidia.com/gpumem": "0x10"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(BOMB, r"^line 1: YAML anchors and aliases are not allowed", id="billion-laughs"),
        pytest.param(b"items:\n- &p {metadata: {uid: x}}\n", r"^line 2: YAML anchors", id="anchor"),
        pytest.param(b"kind: List\nitems:\n- *p\n", r"^line 3: YAML aliases are not allowed", id="alias"),
        pytest.param(
            b"items:\n- metadata: {uid: x}\n  metadata: {uid: y}\n",
            r"^line 3: duplicate key 'metadata'",
            id="duplicate-key",
        ),
        pytest.param(
            b'{"items": [{"metadata": {"uid": "x", "uid": "y"}}]}',
            r"^line 1: duplicate key 'uid'",
            id="json-duplicate-key",
        ),
        pytest.param(
            b'{"kind": "List",\n "kind": "List"}', r"^line 2: duplicate key 'kind'", id="json-duplicate-top-level-key"
        ),
        pytest.param(
            b"items:\n- !!python/object:os.system {}\n", r"^line 2: YAML tag .* is not supported", id="yaml-tag"
        ),
        pytest.param(b"items: " + b"[" * 100 + b"]" * 100, r"^line 1: nested deeper than 64 levels", id="deep-yaml"),
        pytest.param(
            b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", r"^line 1: nested deeper than 64", id="deep-json"
        ),
        pytest.param(b"items:\n- metadata: {uid: x}\n  <<: {a: 1}\n", r"^line 3: YAML merge keys", id="merge-key"),
        pytest.param(b"items:\n- metadata: {uid: x\n", r"^line 3, column 1: ", id="half-written-yaml"),
        pytest.param(as_json(pod_list(POD))[:300], r"^line \d+, column \d+: Expecting", id="half-written-json"),
        pytest.param(b"a: 1\n---\nb: 2\n", r"^line 2: more than one YAML document", id="two-documents"),
        pytest.param(b"", r"^expected a List of Pods .* got nothing", id="empty"),
        pytest.param(b"- a\n- b\n", r"^expected a List of Pods .* got a list", id="not-a-mapping"),
        pytest.param(b"items: {a: 1}\n", r"^items: expected a list of Pods, got a mapping", id="items-not-a-list"),
        pytest.param(b"kind: List\nitems:", r"^items: has no value .*items: \[\]", id="cut-right-after-items"),
        pytest.param(b"items:\nkind: List\n", r"^items: has no value", id="items-without-a-value"),
        pytest.param(b'{"items": null, "kind": "List"}', r"^items: has no value", id="json-items-null"),
        pytest.param(
            b"items:\n- pod\n", r"^line 2: items\[0\]: expected a Pod or Node object, got text", id="item-not-an-object"
        ),
        pytest.param(
            as_yaml(pod_list(POD, {"metadata": {"name": "x", "namespace": "ml"}})),
            r"^line \d+: items\[1\]: pod ml/x: metadata\.uid is missing",
            id="pod-without-uid",
        ),
        pytest.param(
            b'{"items": [{"metadata": {"uid": "u"}, "spec": {"priority": 1e400}}]}',
            r"^items\[0\]: OverflowError",
            id="unexpected-error-in-an-item",
        ),
        pytest.param(b"items:\n- metadata: {uid: \xff}\n", r"invalid|utf-8|special characters", id="not-utf8"),
    ],
)
def test_bad_files_are_refused_naming_the_line(data: bytes, message: str) -> None:
    """Invalid files and `documents`' rules (anchors and aliases, merge keys, duplicate keys, deep nesting): one
    PodSourceError naming the line."""
    for parser in YAML_PARSERS:
        with pytest.raises(PodSourceError, match=message):
            parse_pod_list(data, yaml_parser=parser)


def test_yaml_items_are_translated_as_each_is_read() -> None:
    """A YAML list's items are translated as each is read: an item's fault is reported before a syntax error
    further down."""
    for parser in YAML_PARSERS:
        with pytest.raises(PodSourceError, match=r"^line 2: items\[0\]: expected a Pod or Node object"):
            parse_pod_list(b"items:\n- pod\n- {unclosed\n", yaml_parser=parser)


def test_the_size_bound_holds_for_bytes_given() -> None:
    """parse_pod_list refuses bytes over its bound, whoever read them."""
    with pytest.raises(PodSourceError, match=r"^1.0KiB is over the 1000B bound"):
        parse_pod_list(b"#" * 1024, max_bytes=1000)


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


# --------------------------------------------------------------------------------------------------------------
# The source


def write(path: Path, data: bytes) -> None:
    """Replace the file atomically, as kubectl > tmp && mv would."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def source_of(path: Path, **kwargs: Any) -> FilePodSource:
    """A FilePodSource on a FakeClock, its rounds run by `rounds`."""
    return FilePodSource(str(path), clock=FakeClock(), **kwargs)


def rounds(source: FilePodSource, n: int = 1) -> None:
    """Run `n` rounds of the source's loop on this thread: its FakeClock stops the loop at the n-th wait."""
    clock = source.clock
    assert isinstance(clock, FakeClock)
    left = [n]

    def count() -> None:
        left[0] -= 1
        if left[0] == 0:
            source.loop.stopping.set()

    clock.on_wait = count
    source.loop.stopping.clear()
    source.loop.run()


def test_nothing_is_read_before_start(tmp_path: Path) -> None:
    """Construction touches no file and starts no thread: not synced, no pods, and problem() says why."""
    before = set(threading.enumerate())
    source = source_of(tmp_path / "no" / "such" / "pods.yaml")
    assert not source.synced() and source.pods() == {} and source.node_labels() == {}
    assert source.problem() == f"pods file {tmp_path}/no/such/pods.yaml: not read yet"
    assert not source.loop.running and set(threading.enumerate()) - before == set()
    source.stop(source.clock.now())  # stopping one never started is harmless


def test_serves_this_nodes_pods_and_labels(tmp_path: Path) -> None:
    """Only the pods bound to this node are served, and this Node's labels; the round waits check_interval_s."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD, pod("other", node="gpu-2"), NODE)))
    source = source_of(path, node_name="gpu-1", check_interval_s=0.25)
    rounds(source)
    assert source.synced() and source.problem() is None
    assert list(source.pods()) == [UID]
    assert source.node_labels() == {"nvidia.com/gpu.replicas": "4"}
    assert isinstance(source.clock, FakeClock) and source.clock.waits == [0.25]


def test_missing_file_is_not_synced_until_it_appears(tmp_path: Path) -> None:
    """No file yet: not synced, no pods, and problem() says so; the file appearing syncs the source."""
    path = tmp_path / "pods.yaml"
    source = source_of(path)
    rounds(source, 3)
    assert "No such file or directory" in (source.problem() or "")
    assert not source.synced() and source.pods() == {}
    write(path, as_yaml(pod_list(POD)))
    rounds(source)
    assert source.synced() and source.problem() is None and list(source.pods()) == [UID]


def test_unchanged_file_is_not_parsed_again(tmp_path: Path) -> None:
    """Each round is a stat: the file is parsed again only when its identity (inode, mtime, size) changes."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    source = source_of(path)
    rounds(source, 10)
    assert source.reads == 1
    mtime_ns = path.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(mtime_ns, mtime_ns))
    rounds(source, 10)
    assert source.reads == 2


def test_rewrite_follows_changes(tmp_path: Path) -> None:
    """A rewritten file is picked up at the next round: pods added and removed."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    source = source_of(path)
    rounds(source)
    write(path, as_yaml(pod_list()))
    rounds(source)
    assert source.pods() == {}
    write(path, as_yaml(pod_list(POD, pod("second"))))
    rounds(source)
    assert sorted(source.pods()) == sorted([UID, "second"])


def test_each_version_read_is_heard_once_served(tmp_path: Path) -> None:
    """`on_pods` hears the pods of each version of the file read, once they are served (a pod learned late calls
    for a scan); an unchanged file, or one that cannot be read, says nothing."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    heard: list[list[str]] = []
    source = source_of(path)
    source.on_pods = lambda pods: heard.append([p.uid for p in pods if p.uid in source.pods()])
    rounds(source, 3)
    write(path, b"items: [")
    rounds(source)
    write(path, as_yaml(pod_list(POD, pod("second"))))
    rounds(source)
    assert heard == [[UID], [UID, "second"]]


def test_a_static_pods_mirror_is_served_and_a_forged_claim_logged_once(tmp_path: Path) -> None:
    """A mirror pod in the file is served under the UID the kubelet runs its static pod as, where the node backs it;
    a second pod claiming that UID voids nothing (`index_pods`), and its refusal is logged once however often the
    file changes."""
    static = "6f0c2c0b1b6e4b3f8e1d2a3b4c5d6e7f"
    mirror = pod("m1", name="job-gpu-1", annotations={"kubernetes.io/config.mirror": static})
    forged = pod("f1", name="forged", annotations={"kubernetes.io/config.mirror": static})
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD, mirror)))
    source = source_of(path, kubelet=FakeKubeletPods({static: ("ml", "job-gpu-1")}))
    with capture_logs() as logs:
        rounds(source)
        assert {uid: p.object_uid for uid, p in source.pods().items()} == {UID: UID, static: "m1"}
        for label in ("a", "b"):
            write(
                path,
                as_yaml(pod_list(POD, mirror, {**forged, "metadata": {**forged["metadata"], "labels": {label: ""}}})),
            )
            rounds(source)
            assert {uid: p.object_uid for uid, p in source.pods().items()} == {UID: UID, static: "m1"}
    refused = [e for e in logs if e["event"] == "pod_mirror_claim_refused"]
    assert len(refused) == 1 and refused[0]["pod_uid"] == "f1", refused
    assert "runs that UID as ml/job-gpu-1" in refused[0]["why"]


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
    tmp_path: Path, spoil: Callable[[Path], object], problem: str
) -> None:
    """A file that turns bad keeps the last good pods and problem() names the fault; a good file clears it."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD, NODE)))
    source = source_of(path, node_name="gpu-1", max_bytes=64 * 1024)
    rounds(source)
    good = source.pods()

    spoil(path)
    rounds(source)
    said = source.problem() or ""
    assert said.startswith(f"pods file {path}: ") and re.search(problem, said), said
    assert source.pods() is good and source.synced()
    assert source.node_labels() == {"nvidia.com/gpu.replicas": "4"}

    if path.is_dir():
        path.rmdir()
    write(path, as_yaml(pod_list(pod("new"))))
    rounds(source)
    assert source.problem() is None
    assert list(source.pods()) == ["new"]


def test_each_fault_is_logged_once_and_the_recovery_once(tmp_path: Path) -> None:
    """However many rounds see a fault, it is logged once; a different fault once more; the recovery once."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    source = source_of(path)
    with capture_logs() as logs:
        rounds(source)
        path.unlink()
        rounds(source, 10)
        write(path, BOMB)
        rounds(source, 10)
        write(path, as_yaml(pod_list(POD)))
        rounds(source, 5)
    events = [(e["event"], e.get("error", "")) for e in logs if e["event"].startswith("pods_file")]
    assert [e for e, _ in events] == [
        "pods_file_synced",
        "pods_file_unreadable",
        "pods_file_unreadable",
        "pods_file_recovered",
    ]
    assert "No such file or directory" in events[1][1] and "line 1: YAML anchors" in events[2][1]
    assert all(e["log_level"] == "warning" for e in logs if e["event"] == "pods_file_unreadable")


def test_oversized_file_is_refused_before_reading(tmp_path: Path) -> None:
    """A file over the default 64 MiB bound is refused by its size (a sparse 80 MiB file: nothing is read)."""
    path = tmp_path / "pods.yaml"
    with open(path, "wb") as f:
        f.truncate(80 * MiB)
    source = source_of(path)
    rounds(source)
    assert source.problem() == f"pods file {path}: 80.0MiB is over the 64.0MiB bound"
    assert not source.synced()


def test_file_longer_than_its_size_is_bounded_while_reading() -> None:
    """The bound holds while reading too: a file whose size says 0 (a /proc file) is cut off at the bound."""
    source = source_of(Path("/proc/self/maps"), max_bytes=64)  # regular, size 0, kilobytes long
    rounds(source)
    assert source.problem() == "pods file /proc/self/maps: grew over the 64B bound while being read"


class StopDuringRead(FakeClock):
    """A FakeClock that stops `loop` the first time it is read after being armed: the source reads it just before
    it parses the file, so the stop lands while the file is parsed."""

    def __init__(self) -> None:
        super().__init__()
        self.stops: threading.Event | None = None

    def now(self) -> float:
        if self.stops is not None:
            self.stops.set()
        return super().now()


def test_a_stop_during_a_parse_drops_its_result(tmp_path: Path) -> None:
    """A parse that ends after stop() publishes nothing, and the loop ends after that round."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    clock = StopDuringRead()
    source = FilePodSource(str(path), clock=clock)
    clock.stops = source.loop.stopping
    source.loop.run()
    assert source.reads == 1 and clock.waits == []
    assert not source.synced() and source.pods() == {} and source.problem() == f"pods file {path}: not read yet"


def test_a_fifo_swapped_in_after_the_stat_is_refused_without_blocking(tmp_path: Path) -> None:
    """The loop stats the file, then reads it: a FIFO put at the path in between is opened without blocking and
    refused, so the loop never waits for a writer."""
    path = tmp_path / "pods.yaml"
    write(path, as_yaml(pod_list(POD)))
    looked = os.stat(path)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(PodSourceError, match="not a regular file"):
        source_of(path)._read(looked)
