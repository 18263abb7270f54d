"""Pods as the agent sees them: Kubernetes Pod objects (as plain dicts) converted to `PodInfo` at the edge.

`pod_info_from_manifest` is the one translation from the Kubernetes API shape; the pod watch and the file source
below both use it. It keeps only what the agent reads, bounded: the quota annotations and limits vramguard knows
(`vramguard.quantity`), every string cut to `MAX_VALUE_CHARS`, so a tenant's 10 MB annotation costs nothing per
scan and never reaches a log line.

`FilePodSource` serves pods from a file in the shape `kubectl get pods -o yaml` (or `-o json`) prints (a `List`
of Pods, plus optionally the Node for its labels): the simulated node of `vramguard demo` and the end-to-end tests
use it, and so can an operator who wants to try the agent on a node without API access. The file is read and
parsed on the source's own thread, never in `pods()`, and it is untrusted input: bounded in size, no YAML anchors
or aliases (the "billion laughs"), no duplicate keys, nesting bounded.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
import yaml

from vramguard.dra import (
    Claim,
    ClaimKey,
    DeviceKey,
    PodShares,
    SliceDevice,
    claim_from_manifest,
    pod_shares,
    slice_devices,
)
from vramguard.model import ClaimUse, ContainerInfo, MiB, PodInfo
from vramguard.quantity import ANNOTATION_UNIT_BYTES, RESOURCE_UNIT_BYTES
from vramguard.text import MAX_TEXT_CHARS, cut

Log = structlog.typing.FilteringBoundLogger

MAX_VALUE_CHARS: Final = MAX_TEXT_CHARS
# 5,000 pods as `kubectl get pods -o json` are about 35 MB; the bound leaves room for that and stops a runaway file.
MAX_FILE_BYTES: Final = 64 * MiB
# kubectl's deepest Pod field is about 12 levels down (in managedFields). The bound keeps a "[[[[…" file from
# building values that str() and == would recurse through.
MAX_DEPTH: Final = 64

# libyaml's parser when PyYAML was built with it (about 10x faster than the pure-Python one); both give the same
# events, and the file is built from events either way.
_YAML_LOADER: Final[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_KiB: Final = 1024
# The API server allows 32 resourceClaims per pod; a pods file is not validated, so the same bound applies here.
MAX_CLAIMS: Final = 32


class PodSourceError(Exception):
    pass


# --------------------------------------------------------------------------------------------------------------
# The translation


def _cut(value: object) -> str:
    """`str(value)`, at most `MAX_VALUE_CHARS` characters (`model.cut`)."""
    return cut(value if isinstance(value, str) else str(value), MAX_VALUE_CHARS)


def _strip_scheme(container_id: object) -> str | None:
    """`containerd://abc…` → `abc…`, as the cgroup path names it."""
    if not container_id:
        return None
    return _cut(str(container_id).split("://", 1)[-1])


def _kept(values: Mapping[Any, Any], names: Mapping[str, int]) -> dict[str, str]:
    """The entries of `values` named in `names`, cut: the only ones the agent reads."""
    return {name: _cut(values[name]) for name in names if name in values}


def pod_info_from_manifest(obj: Mapping[str, Any]) -> PodInfo:
    """Convert one Pod object (camelCase keys, as the API server serialises it) into a PodInfo.

    Keeps only the annotations and limits vramguard reads (`ANNOTATION_UNIT_BYTES`, `RESOURCE_UNIT_BYTES`), and
    cuts every string to `MAX_VALUE_CHARS`."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    # Ephemeral containers (`kubectl debug`) are containers too: without them a debug container's GPU process
    # would count as nobody's container, and in a capped namespace escape the cap. They cannot set limits.
    statuses = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")
    ids = {s.get("name"): _strip_scheme(s.get("containerID")) for key in statuses for s in (status.get(key) or [])}
    containers = tuple(
        ContainerInfo(
            name=_cut(c.get("name", "")),
            container_id=ids.get(c.get("name")),
            limits=_kept((c.get("resources") or {}).get("limits") or {}, RESOURCE_UNIT_BYTES),
            claims=_claim_uses((c.get("resources") or {}).get("claims")),
        )
        for key in ("initContainers", "containers", "ephemeralContainers")
        for c in (spec.get(key) or [])
    )
    owners = meta.get("ownerReferences") or []
    owner = next((_cut(f"{o.get('kind')}/{o.get('name')}") for o in owners if o.get("controller")), None)
    uid = meta.get("uid")
    if not uid:
        raise PodSourceError(f"pod {_cut(meta.get('namespace'))}/{_cut(meta.get('name'))}: metadata.uid is missing")
    return PodInfo(
        uid=_cut(uid),
        namespace=_cut(meta.get("namespace", "default")),
        name=_cut(meta.get("name", "")),
        containers=containers,
        annotations=_kept(meta.get("annotations") or {}, ANNOTATION_UNIT_BYTES),
        priority=int(spec.get("priority") or 0),
        qos=_cut(status.get("qosClass") or "BestEffort"),
        owner=owner,
        terminating=meta.get("deletionTimestamp") is not None,
        claims=_pod_claims(spec.get("resourceClaims"), status.get("resourceClaimStatuses")),
    )


def _entries(value: object) -> list[Mapping[str, Any]]:
    """The first MAX_CLAIMS mappings of a list field (anything else in it is skipped)."""
    if not isinstance(value, list):
        return []
    return [v for v in value[:MAX_CLAIMS] if isinstance(v, Mapping)]


def _claim_uses(value: object) -> tuple[ClaimUse, ...]:
    return tuple(ClaimUse(name=_cut(c.get("name", "")), request=_cut(c.get("request") or "")) for c in _entries(value))


def _pod_claims(spec_claims: object, statuses: object) -> dict[str, str | None]:
    """spec.resourceClaims[].name → the ResourceClaim's name: `resourceClaimName`, or for a template the name the
    claim controller recorded in status.resourceClaimStatuses (None until it has)."""
    generated = {s.get("name"): s.get("resourceClaimName") for s in _entries(statuses)}
    claims: dict[str, str | None] = {}
    for c in _entries(spec_claims):
        name = _cut(c.get("name", ""))
        claim = c.get("resourceClaimName") or generated.get(c.get("name"))
        claims[name] = _cut(claim) if claim else None
    return claims


# --------------------------------------------------------------------------------------------------------------
# The file source


@dataclass(frozen=True, slots=True)
class PodList:
    """What one pods file holds for this node: its pods by UID, its Node's labels, and the DRA shares its pods'
    containers hold (from the file's ResourceClaims and this node's ResourceSlices; see `vramguard.dra`)."""

    pods: Mapping[str, PodInfo] = field(default_factory=dict)
    node_labels: Mapping[str, str] = field(default_factory=dict)
    shares: Mapping[str, PodShares] = field(default_factory=dict)


def parse_pod_list(
    data: bytes,
    node_name: str | None = None,
    *,
    pace: Callable[[], None] = lambda: None,
    yaml_loader: Any = _YAML_LOADER,
) -> PodList:
    """The pods bound to `node_name` (all of them when None), and that Node's labels, from a pods file's bytes.

    The file is what `kubectl get pods -o yaml` or `-o json` prints: a List (a mapping with `items`) of Pods and
    optionally the Node, or one Pod or Node; for `claim:` quota sources, also the ResourceClaims and ResourceSlices
    (`kubectl get pods,resourceclaims,resourceslices -A -o yaml`). JSON when it starts with `{`, YAML otherwise.
    YAML anchors, aliases and tags, duplicate keys and nesting deeper than `MAX_DEPTH` are refused; YAML plain
    scalars other than null, booleans and decimal integers stay text (floats, timestamps), as written. The items
    are converted as they are parsed, so the whole document is never held; `pace` is called between steps (a
    parse of 5,000 pods makes tens of thousands of calls), and whatever it raises ends the parse.

    Raises PodSourceError, naming the line where there is one, for anything wrong with the file."""
    collector = _Collector(node_name)
    root = _load(data, collector.add, pace, yaml_loader)
    if not isinstance(root, dict):
        expected = "a List of Pods (kubectl get pods -o yaml), a Pod or a Node"
        raise PodSourceError(f"expected {expected}, got {'nothing' if root is None else _type_name(root)}")
    if "items" in root:  # a List: its items went to the collector as they were parsed
        if root["items"] is None:  # kubectl writes `items: []` for no pods: this is a file cut short
            raise PodSourceError("items: has no value (a file cut right after `items:`?); no pods is `items: []`")
        if root["items"] != []:
            raise PodSourceError(f"items: expected a list of Pods, got {_type_name(root['items'])}")
    else:
        try:
            collector.add(root)
        except Exception as e:
            raise PodSourceError(_describe(e)) from None
    shares = {uid: held for uid, pod in collector.pods.items() if pod.claims and (held := collector.shares(pod))}
    return PodList(pods=collector.pods, node_labels=collector.labels, shares=shares)


class FilePodSource:
    """Pods bound to `node_name` from a YAML/JSON file, re-read on a background thread whenever the file changes.

    The thread stats the file every `check_interval_s` and parses it only when its identity (inode, mtime, size)
    changed. `pods()`, `node_labels()`, `synced()` and `problem()` never touch the file: they return the last
    snapshot the thread published. A file that cannot be read or parsed keeps the last good pods, and
    `problem()` says why: the agent must not forget pods, and so stop protecting their neighbours, because
    someone saved a half-written file. Each distinct fault is logged once, and so is the recovery.

    Construction does no I/O and starts nothing: call `start()` (as for `KubePodSource`), then `stop()`.
    """

    def __init__(
        self,
        path: str,
        node_name: str | None = None,
        *,
        check_interval_s: float = 0.1,
        max_bytes: int = MAX_FILE_BYTES,
        log: Log | None = None,
    ) -> None:
        self.path = path
        self.node_name = node_name
        self.check_interval_s = check_interval_s
        self.max_bytes = max_bytes
        self.log = log if log is not None else structlog.get_logger("vramguard.pods")
        self.reads = 0  # versions of the file parsed, good or bad: for tests and logs
        self._published = PodList()  # replaced whole, never mutated: pods and labels from one read
        self._problem: str | None = self._say("not read yet")
        self._logged: str | None = None  # the fault last logged, so each is logged once
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._read_version: tuple[int, int, int] | None = None  # of the last version parsed, good or bad
        self._thread = threading.Thread(target=self._run, name="vramguard-pods-file", daemon=True)

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

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> FilePodSource:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 1.0) -> None:
        """End the thread, waiting at most `timeout_s`: it checks for stop every few milliseconds of a parse."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    # -- the loop --------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._check()
            if self._stop.wait(self.check_interval_s):
                return

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
        started = time.monotonic()
        try:
            published = self._read(st)
        except _Stopped:
            return
        except PodSourceError as e:
            self._fail(str(e))
            return
        except OSError as e:
            self._fail(e.strerror or str(e))
            return
        except Exception as e:  # the file is anyone's input: whatever it does, keep the last good pods
            self._fail(_describe(e))
            return
        self._published = published
        self._problem = None
        if self._logged is not None:
            self.log.info("pods_file_recovered", path=self.path, pods=len(published.pods))
        elif not self._synced.is_set():
            self.log.info(
                "pods_file_synced",
                path=self.path,
                pods=len(published.pods),
                seconds=round(time.monotonic() - started, 3),
            )
        self._logged = None
        self._synced.set()

    def _fail(self, reason: str) -> None:
        self._problem = self._say(reason)
        if self._problem != self._logged:
            self.log.warning("pods_file_unreadable", error=self._problem, serving_pods=len(self._published.pods))
            self._logged = self._problem

    def _say(self, reason: str) -> str:
        return f"pods file {self.path}: {reason}"

    def _read(self, st: os.stat_result) -> PodList:
        if not stat.S_ISREG(st.st_mode):
            raise PodSourceError("not a regular file")  # a FIFO would block the thread; a device could be endless
        if st.st_size > self.max_bytes:
            raise PodSourceError(f"{_show_size(st.st_size)} is over the {_show_size(self.max_bytes)} bound")
        with open(self.path, "rb") as f:
            data = f.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise PodSourceError(f"grew over the {_show_size(self.max_bytes)} bound while being read")
        return parse_pod_list(data, self.node_name, pace=_Pacer(self._stop))


class _Stopped(Exception):
    """stop() was called while a file was being parsed."""


class _Pacer:
    """Rests the parsing thread `rest_s` after each `work_s` of work, and ends the parse once stop() is called.

    Python threads share one interpreter lock: a thread that parses without pause makes the scan thread wait up to
    the switch interval (5 ms) each time it gets the lock back after a system call, which turned a 4 ms scan into
    200 ms while a 5,000-pod file was parsed. Resting a third of the time leaves gaps a scan fits in."""

    def __init__(self, stop: threading.Event, work_s: float = 0.002, rest_s: float = 0.001) -> None:
        self.stop = stop
        self.work_s = work_s
        self.rest_s = rest_s
        self.until = time.monotonic() + work_s

    def __call__(self) -> None:
        if time.monotonic() < self.until:
            return
        if self.stop.wait(self.rest_s):
            raise _Stopped()
        self.until = time.monotonic() + self.work_s


class _Collector:
    """The pods bound to `node_name` and that Node's labels, from the objects handed over as they are parsed."""

    def __init__(self, node_name: str | None) -> None:
        self.node_name = node_name
        self.pods: dict[str, PodInfo] = {}
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
                self.labels = {_cut(k): _cut(v) for k, v in (meta.get("labels") or {}).items()}
            return
        bound_to = (obj.get("spec") or {}).get("nodeName")
        if self.node_name and bound_to and bound_to != self.node_name:
            return
        info = pod_info_from_manifest(obj)
        self.pods[info.uid] = info


# --------------------------------------------------------------------------------------------------------------
# Parsing: the top-level `items` handed over one at a time (the whole document is never held), in short steps.

_OnItem = Callable[[object], None]

_JSON_START = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*\{")
_JSON_SPACE = re.compile(r"[ \t\r\n]*")


def _load(data: bytes, on_item: _OnItem, pace: Callable[[], None], yaml_loader: Any = _YAML_LOADER) -> object:
    """The document in `data`, less the elements of its top-level `items` list, each handed to `on_item` instead.

    JSON when it starts with `{` (as `kubectl get -o json` prints it), YAML otherwise. `pace` is called between
    steps."""
    if _JSON_START.match(data):
        return _load_json(data.decode("utf-8-sig"), on_item, pace)
    return _load_yaml(data, on_item, pace, yaml_loader)


def _hand_over(on_item: _OnItem, index: int, obj: object, line: int) -> None:
    try:
        on_item(obj)
    except Exception as e:
        raise PodSourceError(f"line {line}: items[{index}]: {_describe(e)}") from None


# -- JSON


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _load_json(text: str, on_item: _OnItem, pace: Callable[[], None]) -> object:
    """The top-level object member by member, and `items` element by element: each decode is one short step."""
    decoder = json.JSONDecoder(object_pairs_hook=_unique_keys)

    def space(i: int) -> int:
        m = _JSON_SPACE.match(text, i)
        return m.end() if m is not None else i

    def expect(i: int, char: str, what: str) -> int:
        if not text.startswith(char, i):
            raise json.JSONDecodeError(f"Expecting {what}", text, i)
        return i + 1

    def value(i: int) -> tuple[Any, int]:
        try:
            return decoder.raw_decode(text, i)
        except _DuplicateKey as e:
            raise PodSourceError(
                f"line {_line_at(text, i)}: duplicate key {str(e)!r} in the value that starts here"
            ) from None

    try:
        root: dict[str, Any] = {}
        i = space(expect(space(0), "{", "'{'"))
        while not text.startswith("}", i):
            if root:
                i = space(expect(i, ",", "',' delimiter"))
            if not text.startswith('"', i):
                raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
            key, i = value(i)
            if key in root:
                raise PodSourceError(f"line {_line_at(text, i)}: duplicate key {key!r}")
            i = space(expect(space(i), ":", "':' delimiter"))
            if key == "items" and text.startswith("[", i):
                root[key] = []
                i = space(i + 1)
                index, line, counted_to = 0, _line_at(text, i), i  # lines counted as the items go: O(n) in all
                while not text.startswith("]", i):
                    if index:
                        i = space(expect(i, ",", "',' delimiter"))
                    pace()
                    line, counted_to = line + text.count("\n", counted_to, i), i
                    item, i = value(i)
                    _hand_over(on_item, index, item, line)
                    index += 1
                    i = space(i)
                i += 1
            else:
                root[key], i = value(i)
            i = space(i)
        i = space(i + 1)
        if i != len(text):
            raise json.JSONDecodeError("Extra data", text, i)
    except json.JSONDecodeError as e:
        raise PodSourceError(f"line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise PodSourceError("JSON nested too deeply") from None
    return root


def _line_at(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


# -- YAML

_STR_TAGS: Final = frozenset({"!", "tag:yaml.org,2002:str"})
_COLLECTION_TAGS: Final = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})
# YAML 1.1 plain scalars that are not text, as PyYAML's SafeLoader resolves them. Other numbers (floats,
# octal, hex) and timestamps stay text, as they were written: vramguard parses quantities itself.
_PLAIN_WORDS: Final[Mapping[str, object]] = {
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
    **dict.fromkeys(("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"), True),
    **dict.fromkeys(("false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"), False),
}
_DECIMAL = re.compile(r"[-+]?(?:0|[1-9][0-9]{0,18})")


@dataclass(slots=True)
class _Frame:
    """A mapping or sequence being built, or, for the top-level `items`, handed over element by element."""

    value: Any
    is_map: bool
    hands_over: bool
    line: int
    key: object = None
    has_key: bool = False
    count: int = 0


def _load_yaml(data: bytes, on_item: _OnItem, pace: Callable[[], None], loader: Any) -> object:
    """One YAML document built from parser events, so nothing is ever expanded: an anchor or alias is refused
    where it appears, before the rest of the file is parsed; so is a duplicate key."""
    stack: list[_Frame] = []
    root: object = None
    documents = 0
    steps = 0
    try:
        for event in yaml.parse(data, Loader=loader):
            steps += 1
            if not steps & 127:
                pace()
            line = event.start_mark.line + 1 if event.start_mark is not None else 0
            value: object
            if isinstance(event, yaml.ScalarEvent):
                _refuse_anchor(event, line)
                value = _scalar(event, line)
            elif isinstance(event, yaml.CollectionStartEvent):
                _refuse_anchor(event, line)
                if event.tag is not None and event.tag not in _COLLECTION_TAGS:
                    raise PodSourceError(f"line {line}: YAML tag {event.tag} is not supported")
                if len(stack) >= MAX_DEPTH:
                    raise PodSourceError(f"line {line}: nested deeper than {MAX_DEPTH} levels")
                is_map = isinstance(event, yaml.MappingStartEvent)
                # The top-level `items` list: its elements go to on_item as each is complete, and are not kept.
                hands_over = not is_map and len(stack) == 1 and stack[0].has_key and stack[0].key == "items"
                stack.append(_Frame({} if is_map else [], is_map, hands_over, line))
                continue
            elif isinstance(event, yaml.CollectionEndEvent):
                frame = stack.pop()
                value, line = frame.value, frame.line
            elif isinstance(event, yaml.AliasEvent):
                raise PodSourceError(f"line {line}: YAML aliases are not allowed (kubectl never writes them)")
            elif isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise PodSourceError(f"line {line}: more than one YAML document")
                continue
            else:
                continue
            if not stack:
                root = value
                continue
            parent = stack[-1]
            if parent.is_map:
                if parent.has_key:
                    parent.value[parent.key] = value
                    parent.has_key = False
                    continue
                if isinstance(value, (dict, list)):
                    raise PodSourceError(f"line {line}: a mapping key must be a scalar")
                if value in parent.value:
                    raise PodSourceError(f"line {line}: duplicate key {value!r}")
                parent.key, parent.has_key = value, True
            elif parent.hands_over:
                _hand_over(on_item, parent.count, value, line)
                parent.count += 1
            else:
                parent.value.append(value)
    except yaml.MarkedYAMLError as e:
        raise PodSourceError(_yaml_problem(e)) from None
    except yaml.YAMLError as e:
        raise PodSourceError(str(e)) from None
    return root


def _refuse_anchor(event: yaml.NodeEvent, line: int) -> None:
    if event.anchor is not None:
        raise PodSourceError(f"line {line}: YAML anchors and aliases are not allowed (kubectl never writes them)")


def _scalar(event: yaml.ScalarEvent, line: int) -> object:
    text = event.value
    if event.tag is not None:
        if event.tag in _STR_TAGS:
            return text
        raise PodSourceError(f"line {line}: YAML tag {event.tag} is not supported")
    if event.style or not event.implicit[0]:  # quoted or block: text (libyaml says '' for plain, PyYAML None)
        return text
    if text in _PLAIN_WORDS:
        return _PLAIN_WORDS[text]
    if _DECIMAL.fullmatch(text):
        return int(text)
    return text


def _yaml_problem(error: yaml.MarkedYAMLError) -> str:
    """A YAML error on one line: "line 3, column 7: mapping values are not allowed here"."""
    mark = error.problem_mark or error.context_mark
    problem = error.problem or error.context or "invalid YAML"
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


# -- words


def _type_name(value: object) -> str:
    names = {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", int: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _describe(e: BaseException) -> str:
    if isinstance(e, (PodSourceError, ValueError)):
        return str(e)
    return f"{type(e).__name__}: {e}"


def _show_size(n: int) -> str:
    """41.3 MiB, 64 MiB, 900 bytes."""
    for unit, size in (("GiB", 1024 * MiB), ("MiB", MiB), ("KiB", _KiB)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"
