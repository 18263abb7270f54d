"""Pods from a file in the shape `kubectl get pods -o yaml` (or `-o json`) prints.

`FilePodSource` serves the pods bound to this node from such a file, re-read on its own `BackgroundLoop` whenever
it changes (`vramguard demo`, the end-to-end tests, a node without API access). The file is loaded by
`vramguard.core.documents` (bounded in size and depth; no YAML anchors, aliases, merge keys or tags; no duplicate
keys; every error naming its line), and each Pod translated by `vramguard.kube.pod_manifest`.
"""

from __future__ import annotations

import functools
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import structlog

from vramguard.base.background import BackgroundLoop
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.core.documents import MAX_BYTES, YAML_PARSERS, DocumentError, load_json, load_yaml
from vramguard.core.pod import PodInfo
from vramguard.core.ports import ApiUidRecord, KubeletPods
from vramguard.core.shares import (
    Claim,
    ClaimKey,
    DeviceKey,
    PodShares,
    SliceDevice,
    pod_shares,
)
from vramguard.core.text import cut, format_bytes
from vramguard.kube.claim_manifest import claim_from_manifest, slice_devices
from vramguard.kube.pod_manifest import PodSourceError, index_pods, log_refused, pod_info_from_manifest

Log = structlog.typing.FilteringBoundLogger


@dataclass(frozen=True, slots=True)
class PodList:
    """What one pods file holds for this node: its pods by UID (the kubelet's: `index_pods`), its Node's labels,
    and the DRA shares its pods' containers hold (from the file's ResourceClaims and this node's ResourceSlices;
    see `vramguard.core.shares`); and the mirror claims not believed (the claiming pod's metadata.uid → why)."""

    pods: Mapping[str, PodInfo] = field(default_factory=dict)
    node_labels: Mapping[str, str] = field(default_factory=dict)
    shares: Mapping[str, PodShares] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)


def parse_pod_list(
    data: bytes,
    node_name: str | None = None,
    *,
    max_bytes: int = MAX_BYTES,
    yaml_parser: str = YAML_PARSERS[0],
    kubelet: KubeletPods | None = None,
    api_uids: ApiUidRecord | None = None,
) -> PodList:
    """The pods bound to `node_name` (all of them when None), and that Node's labels, from a pods file's bytes.

    The file is what `kubectl get pods -o yaml` or `-o json` prints: a List (a mapping with `items`) of Pods and
    optionally the Node, or one Pod or Node; for `claim:` quota sources, also the ResourceClaims and ResourceSlices
    (`kubectl get pods,resourceclaims,resourceslices -A -o yaml`). JSON when it starts with `{`, YAML otherwise,
    under `vramguard.core.documents`' rules; YAML plain scalars other than null, booleans and decimal integers
    stay text (floats, timestamps), as written. A YAML file's items are translated as each is read, so its nodes
    are held one item at a time. `yaml_parser` is one of `documents.YAML_PARSERS`. Mirror claims are judged by
    `index_pods` with `kubelet` and `api_uids`, to which each object's own UID (the API server's) is added first.

    Raises PodSourceError, naming the line where there is one, for anything wrong with the file."""
    collector = _Collector(node_name)
    try:
        if _JSON_START.match(data):
            root = load_json(data, max_bytes=max_bytes)
            items = root.get("items") if isinstance(root, dict) else None
            for index, item in enumerate(items if isinstance(items, list) else []):
                _hand_over(collector.add, item, index, None)
        else:
            on_item = functools.partial(_hand_over, collector.add)
            root = load_yaml(data, max_bytes=max_bytes, on_item=on_item, parser=yaml_parser)
    except DocumentError as e:
        raise PodSourceError(str(e)) from None
    if not isinstance(root, dict):
        expected = "a List of Pods (kubectl get pods -o yaml), a Pod or a Node"
        raise PodSourceError(f"expected {expected}, got {'nothing' if root is None else _type_name(root)}")
    if "items" not in root:
        try:
            collector.add(root)
        except Exception as e:
            raise PodSourceError(_describe(e)) from None
    elif root["items"] is None:  # kubectl writes `items: []` for no pods: this is a file cut short
        raise PodSourceError("items: has no value (a file cut right after `items:`?); no pods is `items: []`")
    elif not isinstance(root["items"], list):
        raise PodSourceError(f"items: expected a list of Pods, got {_type_name(root['items'])}")
    if api_uids is not None:
        api_uids.add(p.object_uid for p in collector.pods.values())
    known = api_uids if api_uids is not None else frozenset(p.object_uid for p in collector.pods.values())
    served = index_pods(collector.pods.values(), kubelet=kubelet, api_uids=known)
    shares = {uid: held for uid, pod in served.pods.items() if pod.claims and (held := collector.shares(pod))}
    return PodList(pods=served.pods, node_labels=collector.labels, shares=shares, refused=served.refused)


_JSON_START: Final = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*\{")


def _hand_over(on_item: Callable[[object], None], item: object, index: int, line: int | None) -> None:
    try:
        on_item(item)
    except Exception as e:  # whatever an item's content makes the translation raise names that item
        where = f"line {line}: " if line is not None else ""
        raise PodSourceError(f"{where}items[{index}]: {_describe(e)}") from None


class _Collector:
    """The pods bound to `node_name`, that Node's labels, and the claims and this node's devices, object by object."""

    def __init__(self, node_name: str | None) -> None:
        self.node_name = node_name
        self.pods: dict[str, PodInfo] = {}  # by metadata.uid
        self.labels: dict[str, str] = {}
        self.claims: dict[ClaimKey, Claim] = {}
        self.devices: dict[DeviceKey, SliceDevice] = {}

    def shares(self, pod: PodInfo) -> PodShares:
        return pod_shares(pod, self.claims, self.devices)

    def add(self, obj: object) -> None:
        if not isinstance(obj, dict):
            raise PodSourceError(f"expected a Pod or Node object, got {_type_name(obj)}")
        if obj.get("kind") == "ResourceClaim":
            claim = claim_from_manifest(obj)
            self.claims[claim.key] = claim
            return
        if obj.get("kind") == "ResourceSlice":
            on = (obj.get("spec") or {}).get("nodeName")
            if not self.node_name or on == self.node_name:  # this node's devices only
                self.devices.update(slice_devices(obj))
            return
        if obj.get("kind") == "Node":
            meta = obj.get("metadata") or {}
            name = meta.get("name")
            if not self.node_name or not name or name == self.node_name:  # not another node's labels
                self.labels = {cut(str(k)): cut(str(v)) for k, v in (meta.get("labels") or {}).items()}
            return
        bound_to = (obj.get("spec") or {}).get("nodeName")
        if self.node_name and bound_to and bound_to != self.node_name:
            return
        info = pod_info_from_manifest(obj)
        self.pods[info.object_uid] = info


# --------------------------------------------------------------------------------------------------------------
# The file source


class FilePodSource:
    """Pods bound to `node_name` from a YAML/JSON file, re-read on a `BackgroundLoop` whenever the file changes.

    Each round stats the file, every `check_interval_s` (on `clock`), and reads it only when its identity (inode,
    mtime, size) changed. `pods()`, `node_labels()`, `synced()` and `problem()` never touch the file: they return
    the last snapshot the loop published. A file that cannot be read or parsed keeps the last good pods, and
    `problem()` says why: the agent must not forget pods, and so stop protecting their neighbours, because
    someone saved a half-written file. Each distinct fault is logged once, and so is the recovery. `on_pods` hears
    each version's pods once they are served (the watch's `ScanCalls.pods_updated`: a pod learned late calls for a
    scan).

    Constructed idle (no I/O, no thread): `start()`, then `stop(deadline)` (`vramguard.base.lifecycle.Service`).
    """

    def __init__(
        self,
        path: str,
        node_name: str | None = None,
        *,
        check_interval_s: float = 0.1,
        max_bytes: int = MAX_BYTES,
        clock: Clock = SYSTEM_CLOCK,
        log: Log | None = None,
        on_pods: Callable[[Iterable[PodInfo]], None] | None = None,
        kubelet: KubeletPods | None = None,
        api_uids: ApiUidRecord | None = None,
    ) -> None:
        self.path = path
        self.kubelet = kubelet
        self.api_uids = api_uids
        self.on_pods = on_pods
        self.node_name = node_name
        self.check_interval_s = check_interval_s
        self.max_bytes = max_bytes
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.reads = 0  # versions of the file parsed, good or bad: for tests and logs
        self._published = PodList()  # replaced whole, never mutated: pods and labels from one read
        self._problem: str | None = self._say("not read yet")
        self._failures = FailureRun()
        self._synced = threading.Event()  # set by the first good read
        self._read_version: tuple[int, int, int] | None = None  # of the last version parsed, good or bad
        self.loop = BackgroundLoop("vramguard-pods-file", self._step, clock=clock, log=self.log)

    # -- PodSource ------------------------------------------------------------------------------------------

    def pods(self) -> Mapping[str, PodInfo]:
        return self._published.pods

    def synced(self) -> bool:
        """True from the first good read on (a later fault keeps the last good pods; `problem()` says so)."""
        return self._synced.is_set()

    def problem(self) -> str | None:
        return self._problem

    def node_labels(self) -> Mapping[str, str]:
        return self._published.node_labels

    def shares(self) -> Mapping[str, PodShares]:
        """The DRA shares (`ClaimSource`): from the ResourceClaims and this node's ResourceSlices in the file."""
        return self._published.shares

    # -- PodLister -------------------------------------------------------------------------------------------

    def present(self) -> frozenset[str]:
        """The pods the file holds now, read afresh (not the version the loop last published): by the UID the
        kubelet runs each under, and each object's own. Raises when the file cannot be read or parsed."""
        pods = self._read(os.stat(self.path)).pods
        return frozenset(pods) | frozenset(p.object_uid for p in pods.values())

    def refused(self) -> Mapping[str, str]:
        """The mirror claims not believed in the version served: the claiming pod's metadata.uid → why."""
        return self._published.refused

    def rejudge(self) -> None:
        """Judge the mirror claims again at the next round (what the node says changed: `KubeletPods.on_change`)."""
        self._read_version = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.loop.start()

    def stop(self, deadline: float) -> None:
        """End the loop by `deadline` (on the clock's scale). A parse cannot be interrupted: one still going at the
        deadline is abandoned, and its result dropped when it ends."""
        self.loop.stop(deadline)

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    # -- the loop --------------------------------------------------------------------------------------------

    def _step(self) -> float:
        self._check()
        return self.check_interval_s

    def _check(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError as e:
            self._read_version = None  # the file put back as it was is a change too
            self._fail(e.strerror or str(e))
            return
        # The inode changes on an atomic rename, which a same-tick rewrite would hide from the mtime alone.
        version = (st.st_ino, st.st_mtime_ns, st.st_size)
        if version == self._read_version:
            return
        self._read_version = version
        self.reads += 1
        started = self.clock.now()
        try:
            published = self._read(st)
        except PodSourceError as e:
            self._fail(str(e))
            return
        except OSError as e:
            self._fail(e.strerror or str(e))
            return
        except Exception as e:  # the file is anyone's input: whatever it does, keep the last good pods
            self._fail(_describe(e))
            return
        if self.loop.stopping.is_set():  # stopped while parsing: the source is done
            return
        log_refused(self.log, published.refused, self._published.refused)
        self._published = published
        self._problem = None
        if self.on_pods is not None:
            self.on_pods(published.pods.values())
        if self._failures.ok():
            self.log.info("pods_file_recovered", path=self.path, pods=len(published.pods))
        elif not self._synced.is_set():
            seconds = round(self.clock.now() - started, 3)
            self.log.info("pods_file_synced", path=self.path, pods=len(published.pods), seconds=seconds)
        self._synced.set()

    def _fail(self, reason: str) -> None:
        self._problem = self._say(reason)
        if self._failures.failed(self._problem):
            self.log.warning("pods_file_unreadable", error=self._problem, serving_pods=len(self._published.pods))

    def _say(self, reason: str) -> str:
        return f"pods file {self.path}: {reason}"

    def _read(self, st: os.stat_result) -> PodList:
        if not stat.S_ISREG(st.st_mode):
            raise PodSourceError("not a regular file")  # a FIFO would block the loop; a device could be endless
        if st.st_size > self.max_bytes:
            raise PodSourceError(f"{format_bytes(st.st_size)} is over the {format_bytes(self.max_bytes)} bound")
        # Without blocking, and the opened file checked again: a FIFO swapped in since the stat would hold the loop.
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with open(fd, "rb", closefd=True) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PodSourceError("not a regular file")
            data = f.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise PodSourceError(f"grew over the {format_bytes(self.max_bytes)} bound while being read")
        return parse_pod_list(
            data, self.node_name, max_bytes=self.max_bytes, kubelet=self.kubelet, api_uids=self.api_uids
        )


# --------------------------------------------------------------------------------------------------------------
# Words


def _type_name(value: object) -> str:
    names = {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", int: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _describe(e: BaseException) -> str:
    if isinstance(e, (PodSourceError, ValueError)):
        return str(e)
    return f"{type(e).__name__}: {e}"
