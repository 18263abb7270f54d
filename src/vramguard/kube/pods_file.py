"""Pods as the agent sees them: Kubernetes Pod objects (as plain dicts) converted to `PodInfo` at the edge.

`pod_info_from_manifest` is the one translation from the Kubernetes API shape; the pod watch and the file source
below both use it. It keeps only what the agent reads, bounded: the quota annotations and limits vramguard knows
(`vramguard.core.quantity`), every string cut to `MAX_VALUE_CHARS`.

`FilePodSource` serves pods from a file in the shape `kubectl get pods -o yaml` (or `-o json`) prints, re-read on
its own thread whenever it changes (`vramguard demo`, the end-to-end tests, a node without API access). The file is
loaded with `json` and PyYAML, bounded in size, with YAML anchors, aliases and tags, duplicate keys and deep nesting
refused; every error names its line.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import os
import re
import stat
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.core.model import ClaimUse, ContainerInfo, MiB, PodInfo
from vramguard.core.quantity import ANNOTATION_UNIT_BYTES, RESOURCE_UNIT_BYTES
from vramguard.core.shares import (
    Claim,
    ClaimKey,
    DeviceKey,
    PodShares,
    SliceDevice,
    pod_shares,
)
from vramguard.core.text import MAX_TEXT_CHARS, cut, format_bytes
from vramguard.kube.claim_manifest import claim_from_manifest, slice_devices

Log = structlog.typing.FilteringBoundLogger

MAX_VALUE_CHARS: Final = MAX_TEXT_CHARS
# 5,000 pods as `kubectl get pods -o json` are about 35 MB; the bound leaves room for that and stops a runaway file.
MAX_FILE_BYTES: Final = 64 * MiB
# kubectl's deepest Pod field is about 12 levels down (in managedFields). The bound keeps a "[[[[…" file from
# building values that str() and == would recurse through.
MAX_DEPTH: Final = 64
# The API server allows 32 resourceClaims per pod; a pods file is not validated, so the same bound applies here.
MAX_CLAIMS: Final = 32


class PodSourceError(Exception):
    pass


# --------------------------------------------------------------------------------------------------------------
# The translation


def _strip_scheme(container_id: object) -> str | None:
    """`containerd://abc…` → `abc…`, as the cgroup path names it."""
    if not container_id:
        return None
    return cut(str(container_id).split("://", 1)[-1])


def _kept(values: Mapping[Any, Any], names: Mapping[str, int]) -> dict[str, str]:
    """The entries of `values` named in `names`, cut: the only ones the agent reads."""
    return {name: cut(str(values[name])) for name in names if name in values}


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
            name=cut(str(c.get("name", ""))),
            container_id=ids.get(c.get("name")),
            limits=_kept((c.get("resources") or {}).get("limits") or {}, RESOURCE_UNIT_BYTES),
            claims=_claim_uses((c.get("resources") or {}).get("claims")),
        )
        for key in ("initContainers", "containers", "ephemeralContainers")
        for c in (spec.get(key) or [])
    )
    owners = meta.get("ownerReferences") or []
    owner = next((cut(f"{o.get('kind')}/{o.get('name')}") for o in owners if o.get("controller")), None)
    uid = meta.get("uid")
    if not uid:
        where = f"{cut(str(meta.get('namespace')))}/{cut(str(meta.get('name')))}"
        raise PodSourceError(f"pod {where}: metadata.uid is missing")
    return PodInfo(
        uid=cut(str(uid)),
        namespace=cut(str(meta.get("namespace", "default"))),
        name=cut(str(meta.get("name", ""))),
        containers=containers,
        annotations=_kept(meta.get("annotations") or {}, ANNOTATION_UNIT_BYTES),
        priority=int(spec.get("priority") or 0),
        qos=cut(str(status.get("qosClass") or "BestEffort")),
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
    return tuple(
        ClaimUse(name=cut(str(c.get("name", ""))), request=cut(str(c.get("request") or ""))) for c in _entries(value)
    )


def _pod_claims(spec_claims: object, statuses: object) -> dict[str, str | None]:
    """spec.resourceClaims[].name → the ResourceClaim's name: `resourceClaimName`, or for a template the name the
    claim controller recorded in status.resourceClaimStatuses (None until it has)."""
    generated = {s.get("name"): s.get("resourceClaimName") for s in _entries(statuses)}
    claims: dict[str, str | None] = {}
    for c in _entries(spec_claims):
        name = cut(str(c.get("name", "")))
        claim = c.get("resourceClaimName") or generated.get(c.get("name"))
        claims[name] = cut(str(claim)) if claim else None
    return claims


# --------------------------------------------------------------------------------------------------------------
# A pods file's content


@dataclass(frozen=True, slots=True)
class PodList:
    """What one pods file holds for this node: its pods by UID, its Node's labels, and the DRA shares its pods'
    containers hold (from the file's ResourceClaims and this node's ResourceSlices; see `vramguard.core.shares`)."""

    pods: Mapping[str, PodInfo] = field(default_factory=dict)
    node_labels: Mapping[str, str] = field(default_factory=dict)
    shares: Mapping[str, PodShares] = field(default_factory=dict)


def parse_pod_list(
    data: bytes, node_name: str | None = None, *, yaml_loader: Callable[[bytes], _YamlChecks] | None = None
) -> PodList:
    """The pods bound to `node_name` (all of them when None), and that Node's labels, from a pods file's bytes.

    The file is what `kubectl get pods -o yaml` or `-o json` prints: a List (a mapping with `items`) of Pods and
    optionally the Node, or one Pod or Node; for `claim:` quota sources, also the ResourceClaims and ResourceSlices
    (`kubectl get pods,resourceclaims,resourceslices -A -o yaml`). JSON when it starts with `{`, YAML otherwise.
    YAML anchors, aliases and tags, duplicate keys and nesting deeper than `MAX_DEPTH` are refused; YAML plain
    scalars other than null, booleans and decimal integers stay text (floats, timestamps), as written.
    `yaml_loader` is one of `YAML_LOADERS` (the first by default).

    Raises PodSourceError, naming the line where there is one, for anything wrong with the file."""
    collector = _Collector(node_name)
    if _JSON_START.match(data):
        root = _load_json(data)
        items = root.get("items") if isinstance(root, dict) else None
        for index, item in enumerate(items if isinstance(items, list) else []):
            _hand_over(collector.add, item, index, None)
    else:
        root = _load_yaml(data, yaml_loader or YAML_LOADERS[0], collector.add)  # the items handed over as read
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
    shares = {uid: held for uid, pod in collector.pods.items() if pod.claims and (held := collector.shares(pod))}
    return PodList(pods=collector.pods, node_labels=collector.labels, shares=shares)


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
                self.labels = {cut(str(k)): cut(str(v)) for k, v in (meta.get("labels") or {}).items()}
            return
        bound_to = (obj.get("spec") or {}).get("nodeName")
        if self.node_name and bound_to and bound_to != self.node_name:
            return
        info = pod_info_from_manifest(obj)
        self.pods[info.uid] = info


# --------------------------------------------------------------------------------------------------------------
# JSON

_JSON_START = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*\{")


def _load_json(data: bytes) -> object:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PodSourceError(f"line {_line_at(data, e.start)}: not UTF-8 ({e.reason})") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey:
        raise _duplicate_key_error(text) from None
    except json.JSONDecodeError as e:
        raise PodSourceError(f"line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise PodSourceError("JSON nested too deeply") from None


class _DuplicateKey(ValueError):
    def __init__(self, key: str, index: int) -> None:
        super().__init__(key)
        self.key = key
        self.index = index  # of the member that repeats a key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for index, (key, _) in enumerate(pairs):
            if key in seen:
                raise _DuplicateKey(key, index)
            seen.add(key)
    return obj


# Neither is in typeshed's stubs: the pure-Python scanner calls `parse_object` for each object and hands it
# `scan_once`, through which each member's value is parsed, so positions can be noted along the way.
_py_make_scanner: Final[Callable[[json.JSONDecoder], Any]] = getattr(json.scanner, "py_make_scanner")  # noqa: B009
_json_object: Final[Callable[..., tuple[Any, int]]] = getattr(json.decoder, "JSONObject")  # noqa: B009


class _LocatingDecoder(json.JSONDecoder):
    """json's pure-Python decoder, noting where each member's value starts so a duplicate key can name its line.
    Slower than `json.loads`: used only once that has met a duplicate key."""

    def __init__(self) -> None:
        super().__init__(object_pairs_hook=_unique_keys)
        self.parse_object = self._parse_object
        self.scan_once = _py_make_scanner(self)

    def _parse_object(
        self, s_and_end: tuple[str, int], strict: bool, scan_once: Callable[[str, int], Any], *rest: Any
    ) -> tuple[Any, int]:
        starts: list[int] = []

        def scan(text: str, i: int) -> Any:
            starts.append(i)
            return scan_once(text, i)

        try:
            return _json_object(s_and_end, strict, scan, *rest)
        except _DuplicateKey as e:
            line = _line_at(s_and_end[0], starts[e.index])
            raise PodSourceError(f"line {line}: duplicate key {cut(repr(e.key), 100)}") from None


def _duplicate_key_error(text: str) -> PodSourceError:
    try:
        _LocatingDecoder().decode(text)
    except PodSourceError as e:
        return e
    except (ValueError, RecursionError):
        pass
    return PodSourceError("duplicate key")  # found by json.loads, so not reached


def _line_at(text: str | bytes, pos: int) -> int:
    return (text.count("\n", 0, pos) if isinstance(text, str) else text.count(b"\n", 0, pos)) + 1


# --------------------------------------------------------------------------------------------------------------
# YAML: PyYAML's composer and safe constructor, with the pods file's checks where each node is composed.

_STR_TAG: Final = "tag:yaml.org,2002:str"
_NULL_TAG: Final = "tag:yaml.org,2002:null"
# The explicit tags a node may carry: "!" (non-specific) and its own kind's. Anything else (`!!python/object`,
# `!!binary`, `!!merge`, `!!set`) is refused rather than constructed.
_ALLOWED_TAGS: Final[Mapping[type[yaml.Event], frozenset[str | None]]] = {
    yaml.ScalarEvent: frozenset({None, "!", _STR_TAG}),
    yaml.SequenceStartEvent: frozenset({None, "!", "tag:yaml.org,2002:seq"}),
    yaml.MappingStartEvent: frozenset({None, "!", "tag:yaml.org,2002:map"}),
}


class _Resolver(BaseResolver):
    """YAML 1.1 plain scalars typed as kubectl means them: null, booleans and decimal integers; anything else
    (floats, octal and hex, timestamps, `<<`) is text as written, for vramguard parses quantities itself."""

    yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012 (PyYAML's class-level table, filled below)


_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"),
)
_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]{0,18})$"), list("-+0123456789")
)
_Resolver.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])


class _YamlChecks(Composer, SafeConstructor):
    """Composition that refuses anchors, aliases, unknown tags, a second document and nesting deeper than
    `MAX_DEPTH` where they appear (before anything is expanded), and construction that refuses duplicate keys.

    Each element of the top-level `items` is constructed and handed to `on_item` as soon as it is composed, so a
    file's nodes are held one item at a time (a node costs tens of times its text)."""

    # Given by the parser the loader is built with (PyYAML's Parser or libyaml's CParser).
    peek_event: Callable[[], Any]
    check_event: Callable[..., bool]
    get_event: Callable[[], Any]

    def __init__(self) -> None:
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        self.on_item: Callable[[object], None] | None = None
        self.depth = 0  # of the collections being composed
        self.in_items = False  # composing the top-level `items` list

    def get_single_node(self) -> Node | None:
        self.get_event()  # the stream's start
        node = None if self.check_event(yaml.StreamEndEvent) else self.compose_document()
        if not self.check_event(yaml.StreamEndEvent):
            raise PodSourceError(f"line {self.peek_event().start_mark.line + 1}: more than one YAML document")
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise PodSourceError(f"line {line}: YAML aliases are not allowed (kubectl never writes them)")
        if event.anchor is not None:
            raise PodSourceError(f"line {line}: YAML anchors and aliases are not allowed (kubectl never writes them)")
        if event.tag not in _ALLOWED_TAGS[type(event)]:
            raise PodSourceError(f"line {line}: YAML tag {cut(event.tag, 100)} is not supported")
        if self.in_items and self.depth == 2 and self.on_item is not None:
            item = self.construct_document(self._compose(parent, index, event, line))
            _hand_over(self.on_item, item, index, line)
            return ScalarNode(_NULL_TAG, "", event.start_mark, event.start_mark)  # constructs as None
        # The root mapping's values are composed at depth 1, each with its key node as `index`.
        opens_items = (
            self.depth == 1
            and isinstance(event, yaml.SequenceStartEvent)
            and isinstance(index, ScalarNode)
            and index.value == "items"
        )
        self.in_items |= opens_items
        try:
            return self._compose(parent, index, event, line)
        finally:
            if opens_items:
                self.in_items = False

    def _compose(self, parent: Node | None, index: Any, event: Any, line: int) -> Node | None:
        if isinstance(event, yaml.ScalarEvent):
            return super().compose_node(parent, index)
        if self.depth >= MAX_DEPTH:
            raise PodSourceError(f"line {line}: nested deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        if len(mapping) < len(node.value):  # a key repeated: find its second occurrence
            seen: set[Hashable] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node)
                if key in seen:
                    line = key_node.start_mark.line + 1
                    raise PodSourceError(f"line {line}: duplicate key {cut(repr(key), 100)}")
                seen.add(key)
        return mapping


class _PyLoader(Reader, Scanner, Parser, _YamlChecks, _Resolver):
    def __init__(self, stream: bytes) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _YamlChecks.__init__(self)
        _Resolver.__init__(self)


YAML_LOADERS: tuple[Callable[[bytes], _YamlChecks], ...] = (_PyLoader,)
if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _CLoader(_YamlChecks, CParser, _Resolver):
        """libyaml's parser (about 10x faster than PyYAML's) under the same composer: `_YamlChecks` comes first in
        the method order, so its composition is used rather than libyaml's, which would resolve aliases."""

        def __init__(self, stream: bytes) -> None:
            CParser.__init__(self, stream)
            _YamlChecks.__init__(self)
            _Resolver.__init__(self)

    YAML_LOADERS = (_CLoader, _PyLoader)


def _load_yaml(data: bytes, loader_class: Callable[[bytes], _YamlChecks], on_item: Callable[[object], None]) -> object:
    """The document, less the elements of its top-level `items` list (None each), handed to `on_item` instead."""
    try:
        loader = loader_class(data)  # PyYAML's reader decodes the start of the stream here
        loader.on_item = on_item
        try:
            node = loader.get_single_node()
            return None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()  # type: ignore[attr-defined]
    except yaml.MarkedYAMLError as e:
        raise PodSourceError(_yaml_problem(e)) from None
    except ReaderError as e:  # not UTF-8, or a control character: the position is a byte offset
        raise PodSourceError(f"line {_line_at(data, e.position)}: {str(e).splitlines()[0]}") from None
    except yaml.YAMLError as e:
        raise PodSourceError(str(e)) from None


def _yaml_problem(error: yaml.MarkedYAMLError) -> str:
    """A YAML error on one line: "line 3, column 7: mapping values are not allowed here"."""
    mark = error.problem_mark or error.context_mark
    problem = error.problem or error.context or "invalid YAML"
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


# --------------------------------------------------------------------------------------------------------------
# The file source


class FilePodSource:
    """Pods bound to `node_name` from a YAML/JSON file, re-read on a background thread whenever the file changes.

    The thread stats the file every `check_interval_s` (on `clock`) and reads it only when its identity (inode,
    mtime, size) changed. `pods()`, `node_labels()`, `synced()` and `problem()` never touch the file: they return
    the last snapshot the thread published. A file that cannot be read or parsed keeps the last good pods, and
    `problem()` says why: the agent must not forget pods, and so stop protecting their neighbours, because
    someone saved a half-written file. Each distinct fault is logged once, and so is the recovery.

    Constructed idle (no I/O, no thread): `start()`, then `stop(deadline)` (`vramguard.base.lifecycle.Service`).
    """

    def __init__(
        self,
        path: str,
        node_name: str | None = None,
        *,
        check_interval_s: float = 0.1,
        max_bytes: int = MAX_FILE_BYTES,
        clock: Clock = SYSTEM_CLOCK,
        log: Log | None = None,
    ) -> None:
        self.path = path
        self.node_name = node_name
        self.check_interval_s = check_interval_s
        self.max_bytes = max_bytes
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger("vramguard.kube.pods_file")
        self.reads = 0  # versions of the file parsed, good or bad: for tests and logs
        self._published = PodList()  # replaced whole, never mutated: pods and labels from one read
        self._problem: str | None = self._say("not read yet")
        self._failures = FailureRun()
        self._synced = threading.Event()  # set by the first good read
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

    def start(self) -> None:
        self._thread.start()

    def stop(self, deadline: float) -> None:
        """End the thread by `deadline` (on the clock's scale). A parse cannot be interrupted: one still going at
        the deadline is abandoned, and its result dropped when it ends."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, deadline - self.clock.now()))

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    # -- the loop --------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._check()
            if self.clock.wait(self._stop, self.check_interval_s):
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
        if self._stop.is_set():  # stopped while parsing: the source is done
            return
        self._published = published
        self._problem = None
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
            raise PodSourceError("not a regular file")  # a FIFO would block the thread; a device could be endless
        if st.st_size > self.max_bytes:
            raise PodSourceError(f"{format_bytes(st.st_size)} is over the {format_bytes(self.max_bytes)} bound")
        with open(self.path, "rb") as f:
            data = f.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise PodSourceError(f"grew over the {format_bytes(self.max_bytes)} bound while being read")
        return parse_pod_list(data, self.node_name)


# --------------------------------------------------------------------------------------------------------------
# Words


def _type_name(value: object) -> str:
    names = {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", int: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _describe(e: BaseException) -> str:
    if isinstance(e, (PodSourceError, ValueError)):
        return str(e)
    return f"{type(e).__name__}: {e}"
