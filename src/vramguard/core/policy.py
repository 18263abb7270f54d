"""The operator's policy (`Policy`, its enums and per-namespace parts) and its loader: YAML → a validated `Policy`.

Every key is optional and a missing one takes the `Policy` default; an unknown key is an error, so a typo
never passes silently. The keys are one table, `POLICY_KEYS` (and `NAMESPACE_KEYS`): the parser reads it, and
docs/reference/policy.md is generated from it. The schema, commented: `config/policy.example.yaml`.

Values: durations are `500ms`, `30s`, `5m`, `1h`, `1m30s` or a number of seconds; byte quantities are
Kubernetes quantities (`16Gi`, `17179869184`, `12e9`; see `vramguard.core.quantity`). A quota (`default.bytes`,
`max_quota`) must be at least 1Mi, as every quota a pod declares must (`quantity.MIN_QUOTA_BYTES`);
`pressure_threshold` is not a quota and may be 0.

Errors are collected, not raised one at a time: `PolicyError.errors` lists every problem, each naming the field
path and the value, e.g. `namespaces.team-a.max_quota: "16GB" is not a valid quantity (...)`.

A policy is a file, or a policy ConfigMap mounted as a directory (the chart's): the document in its key
`policy.yaml`, and each field that the quota admission policy reads too (`DOOR_KEYS`) in a key of its own, named by
the field's path. CEL cannot read YAML, so the door and the agents read those fields from the same keys, and one
edit changes both; in a ConfigMap such a field written in `policy.yaml` is an error.

It is read by `vramguard.base.policyfile` (regular files of at most `MAX_POLICY_BYTES` in all), and its YAML under
`vramguard.core.documents`' rules (bounded; no anchors, aliases, merge keys or tags; no duplicate keys, which plain
`yaml.safe_load` resolves silently in favour of the last one), with YAML 1.1's typing of plain scalars.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final, TypeVar

from vramguard.core.documents import DocumentError, Scalars, load_yaml
from vramguard.core.quantity import (
    MiB,
    QuantityError,
    parse_duration,
    parse_percentage,
    parse_quantity,
    parse_quota_bytes,
)
from vramguard.core.sample import GpuDevice, GpuMemory
from vramguard.core.sources import parse_quota_source
from vramguard.core.text import show_value


class Mode(str, enum.Enum):
    """The policy's mode: what the agent does to an offender (`action`), and whether it enforces at all."""

    WARN = "warn"
    EVICT = "evict"
    KILL = "kill"

    @property
    def action(self) -> ActionKind:
        """The action an offender gets in this mode (a repeat's may go further: `Escalation.kind`)."""
        return _MODE_ACTION[self]


class ActionKind(str, enum.Enum):
    """What an `Action` does: the `action` label of vramguard_actions_total and of the `action` log line."""

    WARN = "warn"  # a Warning Event on the pod
    EVICT = "evict"  # an Eviction through the API server
    KILL = "kill"  # SIGKILL of the container's GPU processes (of all its processes, for a repeat)


_MODE_ACTION = {Mode.WARN: ActionKind.WARN, Mode.EVICT: ActionKind.EVICT, Mode.KILL: ActionKind.KILL}


class DefaultKind(str, enum.Enum):
    """What quota a pod that declares none gets."""

    NONE = "none"  # unmanaged: reported, never acted on
    FIXED = "fixed"  # a fixed number of bytes per container
    FAIR_SHARE = "fair-share"  # GPU memory ÷ the node's nvidia.com/gpu.replicas label


class Orphans(str, enum.Enum):
    """`orphans` in the policy file: what the agent does with the GPU processes of a pod that is gone."""

    RECLAIM = "reclaim"  # kill them (through the kill path, every check of it)
    REPORT = "report"  # a Warning on the Node, the metric: nothing is signalled


class EvictionRefused(str, enum.Enum):
    """What to do when the Eviction API keeps refusing (PodDisruptionBudget)."""

    WAIT = "wait"
    KILL = "kill"


class OnRepeat(str, enum.Enum):
    """What a repeat gets: a container instance found over its quota again within the repeat window after a kill."""

    KILL_CONTAINER = "kill-container"  # every process of the container, GPU holders or not: the runtime restarts it
    EVICT = "evict"  # the pod, through the Eviction API (PodDisruptionBudgets and on_eviction_refused apply)
    WAIT = "wait"  # a plain kill once the cooldown since the last one ends: over its quota that long


class DriverLimits(str, enum.Enum):
    """Whether the agent programs the driver's per-cgroup memory limits (R615+) from quotas, in evict/kill."""

    AUTO = "auto"  # where the driver, the GPU and the host support them; reactive enforcement everywhere else
    OFF = "off"  # never call them
    REQUIRE = "require"  # as auto, and /readyz fails on a node where they cannot be applied


@dataclass(frozen=True, slots=True)
class DefaultQuota:
    kind: DefaultKind = DefaultKind.NONE
    bytes: int | None = None  # for FIXED


@dataclass(frozen=True, slots=True)
class NamespacePolicy:
    mode: Mode | None = None  # overrides Policy.mode
    max_quota_bytes: int | None = None  # cap on every quota in the namespace; annotations cannot exceed it
    default: DefaultQuota | None = None  # overrides Policy.default
    on_repeat: OnRepeat | None = None  # overrides Policy.on_repeat


# The order a container's quota is looked for in (the first valid one wins): vramguard's own resource, the resources
# other GPU-sharing schedulers place pods by, then NVIDIA's per-container declarations (KAI's annotations before the
# variables its NRI plugin writes from them, over any the pod sets), then the pod-wide annotations, which a
# per-container declaration is more precise than (KAI itself prefers its per-container request to `gpu-memory`).
DEFAULT_QUOTA_SOURCES: tuple[str, ...] = (
    "resource:vramguard.io/vram",
    "resource:aliyun.com/gpu-mem",
    "resource:nvidia.com/gpumem",
    "resource:tencent.com/vcuda-memory",
    "annotation:nvidia.com/container.<container>.gpu-memory",
    "env:NVIDIA_GPU_MEMORY",
    "annotation:vramguard.io/vram-limit",
    "annotation:gpu-memory",
)


@dataclass(frozen=True, slots=True)
class Policy:
    """The operator's policy file, validated. Blast-radius limits are data here, not code."""

    mode: Mode = Mode.WARN
    hard_grace_s: float = 0.0
    soft_grace_s: float = 60.0
    # A GPU is under pressure when free memory is below either threshold (whichever is set).
    pressure_free_bytes: int | None = None
    pressure_free_ratio: float | None = 0.05
    # `pressure_transition_period` in the policy file: a GPU leaves pressure only once its free memory has stayed
    # above the threshold this long (the kubelet's --eviction-pressure-transition-period), so a GPU whose free
    # memory hovers around the threshold does not flap in and out of pressure with every allocation.
    pressure_transition_s: float = 30.0
    max_actions_per_scan: int = 1
    # How long an action holds the next one on the same target: a kill on that container instance (a repeat
    # excepted), an eviction on that pod. A restarted container is a new instance: the kubelet's back-off spaces it.
    cooldown_s: float = 60.0
    # `repeat_window` in the policy file (>= 10s): a container instance killed in and over its quota again within
    # this long is a repeat, whatever the cooldown.
    repeat_window_s: float = 300.0
    # None: the mode's next step (kill mode: kill-container; evict mode: evict), so a repeat is always bounded.
    on_repeat: OnRepeat | None = None
    on_eviction_refused: EvictionRefused = EvictionRefused.WAIT
    # `eviction_timeout` in the policy file (> 0): how long the agent tries to evict a pod, retries included,
    # before it counts the eviction as refused (then on_eviction_refused applies): a frozen or unreachable API
    # server must not protect an offender from `on_eviction_refused: kill`.
    eviction_timeout_s: float = 15.0
    driver_limits: DriverLimits = DriverLimits.AUTO
    # The watch between scans (`watch.py`): each GPU's memory counter read every `watch_interval_s` (0: no watch,
    # scans on the poll alone); a change since the last scan (a rise or a fall) by more than the smaller of the two
    # (whichever is set), or a GPU entering pressure, scans at once, at most `triggered_scans_per_second` (a burst
    # of as many). 20 ms: a reading costs ~0.1-0.2 ms of CPU in a VM (its wake-up more than its NVML call), a tenth
    # of the ~100 ms a killed CUDA process takes to let go of its memory
    # (docs/architecture.md "The watch between scans").
    watch_interval_s: float = 0.02
    watch_rise_bytes: int | None = 256 * 1024 * 1024
    watch_rise_ratio: float | None = 0.01
    triggered_scans_per_second: float = 10.0
    exempt_namespaces: frozenset[str] = frozenset({"kube-system"})
    # Orphans (`core/orphans.py`): GPU processes in the cgroup of a pod absent from a healthy pod cache for
    # `orphan_grace_s`, and from a fresh read of the API server. None: reclaimed in kill and evict mode, reported
    # in warn mode. The grace is long enough for the kubelet's own cleanup of a deleted pod to win.
    orphans: Orphans | None = None
    orphan_grace_s: float = 120.0
    quota_sources: tuple[str, ...] = DEFAULT_QUOTA_SOURCES
    default: DefaultQuota = DefaultQuota()
    namespaces: Mapping[str, NamespacePolicy] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def reclaims_orphans(self) -> bool:
        """Whether orphans are killed (`orphans: reclaim`, or the default in kill and evict mode)."""
        if self.orphans is not None:
            return self.orphans is Orphans.RECLAIM
        return self.mode in (Mode.KILL, Mode.EVICT)

    def mode_for(self, namespace: str) -> Mode:
        ns = self.namespaces.get(namespace)
        return ns.mode if ns is not None and ns.mode is not None else self.mode

    def on_repeat_for(self, namespace: str) -> OnRepeat:
        ns = self.namespaces.get(namespace)
        chosen = ns.on_repeat if ns is not None and ns.on_repeat is not None else self.on_repeat
        if chosen is not None:
            return chosen
        return OnRepeat.EVICT if self.mode_for(namespace) is Mode.EVICT else OnRepeat.KILL_CONTAINER

    def default_for(self, namespace: str) -> DefaultQuota:
        ns = self.namespaces.get(namespace)
        return ns.default if ns is not None and ns.default is not None else self.default

    def cap_for(self, namespace: str) -> int | None:
        ns = self.namespaces.get(namespace)
        return ns.max_quota_bytes if ns is not None else None

    def under_pressure(self, device: GpuDevice | GpuMemory) -> bool:
        if self.pressure_free_bytes is not None and device.free_bytes < self.pressure_free_bytes:
            return True
        return (
            self.pressure_free_ratio is not None and device.free_bytes < self.pressure_free_ratio * device.total_bytes
        )

    def watch_rise_for(self, total_bytes: int) -> int:
        """The change in a GPU's used memory since the last scan that scans at once: the smaller threshold set."""
        limits = [b for b in (self.watch_rise_bytes,) if b is not None]
        if self.watch_rise_ratio is not None:
            limits.append(int(self.watch_rise_ratio * total_bytes))
        return min(limits) if limits else total_bytes

    def exemption(self, pod_uid: str, namespace: str, agent_pod_uid: str | None = None) -> str | None:
        """Why the agent never acts on a pod (no kill, eviction, driver limit or orphan reclaim; warnings and
        notices still reach it), or None when it may: the agent's own pod, or a pod in an exempt namespace."""
        if agent_pod_uid is not None and pod_uid == agent_pod_uid:
            return "the agent's own pod"
        if namespace in self.exempt_namespaces:
            return f"namespace {namespace} is exempt"
        return None


_T = TypeVar("_T")
_E = TypeVar("_E", bound=enum.Enum)

DEFAULT_FIELDS: Final = ("kind", "bytes")

_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label, as Kubernetes requires

# A policy ConfigMap's key for the document, and the keys of the fields the admission policy reads as well
# (deploy/helm/vramguard/templates/quotaadmission.yaml reads the same names and splits lists as `LIST_ITEM` does).
DOCUMENT_KEY: Final = "policy.yaml"
DOOR_KEYS: Final = ("exempt_namespaces", "quota_sources", "namespaces.<namespace>.max_quota")
_DOOR_KEY = re.compile(r"exempt_namespaces|quota_sources|namespaces\.(?P<namespace>[^.]+)\.max_quota")
LIST_ITEM: Final = re.compile(r"[^ \t\r\n,]+")  # a list in a key: items apart by spaces, tabs, line breaks or commas


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem in a policy: where (a dotted path, "" for the whole document), the value, and what is wrong."""

    path: str
    value: object
    message: str  # reads after the value: "is not a valid quantity (...)"
    show: bool = True  # False when there is no value worth showing (a missing or unknown key)

    def __str__(self) -> str:
        text = f"{show_value(self.value)} {self.message}" if self.show else self.message
        return f"{self.path}: {text}" if self.path else text


class PolicyError(ValueError):
    """A policy that cannot be used, with every problem found in it."""

    def __init__(self, errors: Sequence[FieldError], source: str | None = None) -> None:
        self.errors = list(errors)
        self.source = source
        where = f" in {source}" if source else ""
        count = f"{len(self.errors)} error" + ("s" if len(self.errors) != 1 else "")
        super().__init__(f"invalid policy{where} ({count}):\n" + "\n".join(f"  {e}" for e in self.errors))


class _Invalid(ValueError):
    """Raised by a converter; the message reads after the value (`must be one of ...`)."""


def parse_policy(data: object) -> Policy:
    """Plain data (a parsed YAML document) → a validated Policy. Raises PolicyError listing every problem."""
    parser = _Parser()
    policy = parser.policy(data)
    if parser.errors or policy is None:
        raise PolicyError(parser.errors)
    return policy


# A ConfigMap holds 1 MiB at most, a policy a few KiB: a bigger file is a mistake, and reading it costs memory.
MAX_POLICY_BYTES: Final = MiB


@dataclass(frozen=True, slots=True)
class PolicyText:
    """A policy as read, not yet parsed (`base.policyfile.read_policy_file`): a file's bytes (`keys` None), or a
    policy ConfigMap's: `document` its `DOCUMENT_KEY` (empty where it has none) and `keys` every other key."""

    document: bytes
    keys: Mapping[str, bytes] | None = None

    @property
    def content(self) -> bytes:
        """What a reload compares and /status hashes: the file, or each key of the ConfigMap by name (name, length,
        bytes), so that no two ConfigMaps read alike."""
        if self.keys is None:
            return self.document
        every = sorted({DOCUMENT_KEY: self.document, **self.keys}.items())
        return b"".join(f"{name}\0{len(value)}\0".encode() + value for name, value in every)

    @classmethod
    def of_config_map(cls, data: Mapping[str, str]) -> PolicyText:
        """A policy ConfigMap's `data`, as an agent that mounts it reads it."""
        keys = {name: value.encode() for name, value in data.items()}
        return cls(keys.pop(DOCUMENT_KEY, b""), keys)


def policy_from_text(text: PolicyText, source: str) -> Policy:
    """A policy as read (`base.policyfile.read_policy_file`) → a validated Policy; PolicyError names `source`."""
    where = f"{DOCUMENT_KEY}: " if text.keys is not None else ""
    try:
        data = load_yaml(text.document, scalars=Scalars.YAML_1_1, max_bytes=MAX_POLICY_BYTES)
    except DocumentError as e:
        raise PolicyError([FieldError("", None, f"{where}is not valid YAML: {e}", show=False)], source) from e
    data = {} if data is None else data
    errors: list[FieldError] = []
    if text.keys is not None:
        data, errors = _with_door_keys(data, text.keys)
    try:
        policy = parse_policy(data)
    except PolicyError as e:
        errors += e.errors
    if errors:
        raise PolicyError(errors, source)
    return policy


def _with_door_keys(data: object, keys: Mapping[str, bytes]) -> tuple[object, list[FieldError]]:
    """The document with a ConfigMap's door keys (`DOOR_KEYS`) put in as the fields they name, and what is wrong:
    a door field written in the document (the admission policy would not see it), or a key that is no door key."""
    errors: list[FieldError] = []
    if not isinstance(data, dict):
        return data, errors  # parse_policy says what the document should be
    merged = dict(data)
    written = {name: data[name] for name in ("exempt_namespaces", "quota_sources") if name in data}
    entries = data.get("namespaces")
    if isinstance(entries, dict):
        written |= {
            f"namespaces.{name}.max_quota": entry["max_quota"]
            for name, entry in entries.items()
            if isinstance(entry, dict) and "max_quota" in entry
        }
    for path, value in written.items():
        message = f"belongs in the ConfigMap's key {path}, which the admission policy reads too, not in {DOCUMENT_KEY}"
        errors.append(FieldError(f"{DOCUMENT_KEY}: {path}", value, message))
    caps: dict[str, str] = {}
    for name, raw in sorted(keys.items()):
        match = _DOOR_KEY.fullmatch(name)
        if match is None:
            known = ", ".join((DOCUMENT_KEY, *DOOR_KEYS))
            errors.append(FieldError(name, None, f"is not a key of a policy ConfigMap ({known})", show=False))
            continue
        try:
            value = raw.decode()
        except UnicodeDecodeError:
            errors.append(FieldError(name, None, "is not UTF-8 text", show=False))
            continue
        if match["namespace"] is None:
            merged[name] = LIST_ITEM.findall(value)
        else:
            caps[match["namespace"]] = value
    if caps and isinstance(entries, dict | None):
        namespaces = dict(entries or {})
        for name, cap in caps.items():
            entry = namespaces.get(name)
            if entry is None or isinstance(entry, dict):
                namespaces[name] = {**(entry or {}), "max_quota": cap}
        merged["namespaces"] = namespaces
    return merged, errors


@dataclass(frozen=True, slots=True)
class Overrides:
    """What the agent's flags set over the policy file, applied to it at start and to each reload alike: `--mode`,
    `--driver-limits`, `--watch-interval`, and the agent's own namespace, always exempt. None: the file's value."""

    mode: Mode | None = None
    driver_limits: DriverLimits | None = None
    watch_interval_s: float | None = None
    agent_namespace: str | None = None

    def apply(self, policy: Policy) -> Policy:
        if self.mode is not None:
            policy = replace(policy, mode=self.mode)
        if self.driver_limits is not None:
            policy = replace(policy, driver_limits=self.driver_limits)
        if self.watch_interval_s is not None:
            policy = replace(policy, watch_interval_s=self.watch_interval_s)
        if self.agent_namespace:
            policy = replace(policy, exempt_namespaces=policy.exempt_namespaces | {self.agent_namespace})
        return policy


# --------------------------------------------------------------------------------------------------------------
# Parsing


class _Parser:
    """Walks the document once, recording every problem and returning None for the parts that are wrong."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def fail(self, path: str, value: object, message: str, *, show: bool = True) -> None:
        self.errors.append(FieldError(path, value, message, show))

    def convert(self, path: str, value: object, convert: Callable[[object], _T]) -> _T | None:
        try:
            return convert(value)
        except QuantityError as e:
            self.fail(path, value, f"is not a valid {e.what} ({e.reason})")
        except _Invalid as e:
            self.fail(path, value, str(e))
        return None

    def mapping(self, data: object, path: str, fields: Sequence[str] | None) -> dict[str, object] | None:
        """The string-keyed entries of a mapping; unknown keys (when `fields` is given) are reported and dropped."""
        if not isinstance(data, Mapping):
            expected = f" with the fields {', '.join(fields)}" if fields is not None else ""
            self.fail(path, data, f"is not a mapping{expected}")
            return None
        entries: dict[str, object] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                # YAML 1.1 reads unquoted yes/no/on/off and numbers as non-strings.
                self.fail(path, key, "is not a string key (quote it)")
                continue
            if fields is not None and key not in fields:
                close = difflib.get_close_matches(key, fields, n=1)
                hint = f"did you mean {close[0]}?" if close else f"known fields: {', '.join(fields)}"
                self.fail(_join(path, key), None, f"is not a known field ({hint})", show=False)
                continue
            entries[key] = value
        return entries

    def sequence(self, data: object, path: str) -> list[object] | None:
        if isinstance(data, str) or not isinstance(data, Sequence):
            self.fail(path, data, "is not a list")
            return None
        return list(data)

    def policy(self, data: object) -> Policy | None:
        fields = self.mapping(data, "", TOP_LEVEL_FIELDS)
        if fields is None:
            return None
        changes: dict[str, Any] = {}
        for key, value in fields.items():
            changes.update(_TOP_LEVEL[key].read(self, key, value))
        if self.errors:
            return None
        return replace(Policy(), **changes)

    def pressure(self, path: str, value: object) -> tuple[int | None, float | None] | None:
        """(free bytes, free ratio) from `5%`, `2Gi` or a list of at most one of each."""
        listed = isinstance(value, list)
        free_bytes: int | None = None
        free_ratio: float | None = None
        valid = True
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            item_path = f"{path}[{i}]" if listed else path
            if isinstance(item, str) and item.endswith("%"):
                ratio = self.convert(item_path, item, parse_percentage)
                if ratio is not None and free_ratio is not None:
                    self.fail(item_path, item, "is a second percentage; give at most one percentage and one size")
                    ratio = None
                valid = valid and ratio is not None
                free_ratio = ratio if ratio is not None else free_ratio
            else:
                n_bytes = self.convert(item_path, item, parse_quantity)
                if n_bytes is not None and free_bytes is not None:
                    self.fail(item_path, item, "is a second size; give at most one percentage and one size")
                    n_bytes = None
                valid = valid and n_bytes is not None
                free_bytes = n_bytes if n_bytes is not None else free_bytes
        return (free_bytes, free_ratio) if valid else None

    def namespace_names(self, path: str, value: object) -> list[str] | None:
        items = self.sequence(value, path)
        if items is None:
            return None
        names = [self.convert(f"{path}[{i}]", item, _namespace_name) for i, item in enumerate(items)]
        return [n for n in names if n is not None]

    def quota_sources(self, path: str, value: object) -> tuple[str, ...] | None:
        items = self.sequence(value, path)
        if items is None:
            return None
        sources: list[str] = []
        for i, item in enumerate(items):
            source = self.convert(f"{path}[{i}]", item, _quota_source)
            if source is None:
                continue
            if source in sources:
                self.fail(f"{path}[{i}]", item, f"is listed twice (first at {path}[{sources.index(source)}])")
            sources.append(source)
        return tuple(sources)

    def default(self, path: str, value: object) -> DefaultQuota | None:
        fields = self.mapping(value, path, DEFAULT_FIELDS)
        if fields is None:
            return None
        if "kind" not in fields:
            kinds = ", ".join(k.value for k in DefaultKind)
            self.fail(_join(path, "kind"), None, f"is required (one of {kinds})", show=False)
            return None
        kind = self.convert(_join(path, "kind"), fields["kind"], _choice(DefaultKind))
        if kind is None:
            return None
        if kind is not DefaultKind.FIXED:
            if "bytes" in fields:
                self.fail(_join(path, "bytes"), fields["bytes"], f"is only allowed with kind fixed, not {kind.value}")
            return DefaultQuota(kind)
        if "bytes" not in fields:
            self.fail(_join(path, "bytes"), None, "is required when kind is fixed (e.g. bytes: 8Gi)", show=False)
            return None
        n_bytes = self.convert(_join(path, "bytes"), fields["bytes"], parse_quota_bytes)
        return DefaultQuota(kind, n_bytes) if n_bytes is not None else None

    def namespaces(self, path: str, value: object) -> Mapping[str, NamespacePolicy] | None:
        entries = self.mapping(value, path, None)
        if entries is None:
            return None
        result: dict[str, NamespacePolicy] = {}
        for name, entry in entries.items():
            if not _NAMESPACE_NAME.fullmatch(name):
                self.fail(path, name, _NAMESPACE_NAME_RULE)
                continue
            ns_path = _join(path, name)
            fields = self.mapping(entry, ns_path, NAMESPACE_FIELDS)
            if fields is None:
                continue
            changes: dict[str, Any] = {}
            for key, field_value in fields.items():  # in file order, so errors read top to bottom
                changes.update(_IN_NAMESPACE[key].read(self, _join(ns_path, key), field_value))
            result[name] = NamespacePolicy(**changes)
        return MappingProxyType(result)


_NAMESPACE_NAME_RULE: Final = "is not a valid namespace name (lowercase letters, digits and '-', at most 63)"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _choice(enum_type: type[_E]) -> Callable[[object], _E]:
    def convert(value: object) -> _E:
        for member in enum_type:
            if value == member.value:
                return member
        raise _Invalid(f"must be one of {', '.join(str(m.value) for m in enum_type)}")

    return convert


def _positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid("must be a whole number of at least 1")
    if value < 1:
        raise _Invalid("must be at least 1 (to never evict or kill, use mode: warn)")
    return value


def _positive_duration(value: object) -> float:
    seconds = parse_duration(value)  # a QuantityError says what is wrong with the spelling
    if seconds <= 0:
        raise _Invalid("must be longer than 0s")
    return seconds


MIN_REPEAT_WINDOW_S: Final = 10.0


def _repeat_window(value: object) -> float:
    seconds = parse_duration(value)
    if seconds < MIN_REPEAT_WINDOW_S:
        # A supervisor that respawns its workers a few seconds after a kill would never be a repeat.
        raise _Invalid(f"must be at least {MIN_REPEAT_WINDOW_S:g}s (a shorter window switches off the repeat rule)")
    return seconds


# The kubelet tears a deleted pod down in seconds; its cleanup of the pod's cgroup can wait longer (for volumes).
# A grace shorter than this would race the kubelet's own cleanup for nothing.
MIN_ORPHAN_GRACE_S: Final = 10.0


def _orphan_grace(value: object) -> float:
    seconds = parse_duration(value)
    if seconds < MIN_ORPHAN_GRACE_S:
        raise _Invalid(f"must be at least {MIN_ORPHAN_GRACE_S:g}s (a shorter grace races the kubelet's own cleanup)")
    return seconds


MIN_WATCH_INTERVAL_S: Final = 0.001
MAX_WATCH_INTERVAL_S: Final = 1.0


def parse_watch_interval(value: object) -> float:
    """The watch's interval: 0s (no watch), or from 1ms (a shorter one is a busy loop) to 1s (longer is no watch)."""
    seconds = parse_duration(value)
    if seconds != 0 and not MIN_WATCH_INTERVAL_S <= seconds <= MAX_WATCH_INTERVAL_S:
        raise _Invalid("must be 0s (no watch: scans on the poll alone) or from 1ms to 1s")
    return seconds


def _scans_per_second(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 100:
        raise _Invalid("must be a number from 1 to 100 (to scan on the poll alone, set watch_interval: 0s)")
    return float(value)


def _namespace_name(value: object) -> str:
    if not isinstance(value, str) or not _NAMESPACE_NAME.fullmatch(value):
        raise _Invalid(_NAMESPACE_NAME_RULE)
    return value


def _quota_source(value: object) -> str:
    if not isinstance(value, str):
        raise _Invalid("must be a string such as resource:vramguard.io/vram")
    try:
        parse_quota_source(value)
    except ValueError as e:
        raise _Invalid(f"is not a quota source ({e})") from None
    return value


# --------------------------------------------------------------------------------------------------------------
# The keys: one table, read by the parser above and by the reference (docs/reference/policy.md)

# A key's value → the `Policy` (or `NamespacePolicy`) fields it sets; problems go to the parser, and a field that
# could not be read is set to None (the parser then returns no policy) or left out.
Reader = Callable[[_Parser, str, object], Mapping[str, object]]


@dataclass(frozen=True, slots=True)
class PolicyKey:
    """One key of the policy file: what it takes, its default as the file would spell it (None: there is no
    spelling, `doc` says what its absence means; a test parses each spelling back to `Policy()`'s value), what it
    does, and how the parser reads it."""

    name: str
    type: str
    default: str | None
    doc: str
    read: Reader


def _set(field_name: str, convert: Callable[[object], object]) -> Reader:
    return lambda parser, path, value: {field_name: parser.convert(path, value, convert)}


def _bytes_or_ratio(bytes_field: str, ratio_field: str) -> Reader:
    def read(parser: _Parser, path: str, value: object) -> Mapping[str, object]:
        found = parser.pressure(path, value)
        return {} if found is None else {bytes_field: found[0], ratio_field: found[1]}

    return read


def _exempt(parser: _Parser, path: str, value: object) -> Mapping[str, object]:
    names = parser.namespace_names(path, value)
    return {"exempt_namespaces": frozenset(names) if names is not None else None}


def _one_of(enum_type: type[enum.Enum]) -> str:
    return " | ".join(str(m.value) for m in enum_type)


_SIZE_OR_SHARE: Final = "byte quantity, percentage, or a list of at most one of each"

POLICY_KEYS: Final = (
    PolicyKey(
        "mode",
        _one_of(Mode),
        Mode.WARN.value,
        "What the agent does to a container over its quota: a Warning Event and a metric (warn), the Eviction API "
        "(evict), or SIGKILL of its GPU processes (kill).",
        _set("mode", _choice(Mode)),
    ),
    PolicyKey(
        "hard_grace",
        "duration",
        "0s",
        "How long usage may stay above the hard limit (the quota, or the burst where one is set) before the agent "
        "acts; 0s acts on the next scan.",
        _set("hard_grace_s", parse_duration),
    ),
    PolicyKey(
        "soft_grace",
        "duration",
        "60s",
        "How long usage may stay above the soft limit (the quota, when a burst is set) while the GPU has headroom; "
        "under GPU memory pressure the agent does not wait.",
        _set("soft_grace_s", parse_duration),
    ),
    PolicyKey(
        "pressure_threshold",
        _SIZE_OR_SHARE,
        "5%",
        "A GPU is under pressure when its free memory falls below this (below either, for a list); [] turns "
        "pressure off.",
        _bytes_or_ratio("pressure_free_bytes", "pressure_free_ratio"),
    ),
    PolicyKey(
        "pressure_transition_period",
        "duration",
        "30s",
        "A GPU leaves pressure only once its free memory has stayed above the threshold this long, so it does not "
        "flap; 0s leaves at once.",
        _set("pressure_transition_s", parse_duration),
    ),
    PolicyKey(
        "max_actions_per_scan",
        "whole number, at least 1",
        "1",
        "At most this many evictions or kills per scan, to bound the blast radius; warnings are not counted.",
        _set("max_actions_per_scan", _positive_int),
    ),
    PolicyKey(
        "cooldown",
        "duration",
        "60s",
        "How long an action holds the next one on the same target: the container instance killed in (kill), the "
        "pod (evict). A restarted container is a new instance. Never holds a repeat, except with on_repeat: wait.",
        _set("cooldown_s", parse_duration),
    ),
    PolicyKey(
        "repeat_window",
        f"duration, at least {MIN_REPEAT_WINDOW_S:g}s",
        "5m",
        "A container instance killed in and over its quota again within this long is a repeat, whatever the "
        "cooldown: a supervisor respawned its GPU workers.",
        _set("repeat_window_s", _repeat_window),
    ),
    PolicyKey(
        "on_repeat",
        _one_of(OnRepeat),
        None,
        "What a repeat gets: every process of the container (kill-container), the pod evicted (evict), or a plain "
        "kill once the cooldown ends (wait). Unset: kill-container in kill mode, evict in evict mode.",
        _set("on_repeat", _choice(OnRepeat)),
    ),
    PolicyKey(
        "on_eviction_refused",
        _one_of(EvictionRefused),
        EvictionRefused.WAIT.value,
        "When PodDisruptionBudgets keep refusing an eviction: retry later (wait) or fall back to killing (kill).",
        _set("on_eviction_refused", _choice(EvictionRefused)),
    ),
    PolicyKey(
        "eviction_timeout",
        "duration, longer than 0s",
        "15s",
        "How long the agent tries to evict a pod, retries included, before it counts the eviction as refused (then "
        "on_eviction_refused applies).",
        _set("eviction_timeout_s", _positive_duration),
    ),
    PolicyKey(
        "driver_limits",
        _one_of(DriverLimits),
        DriverLimits.AUTO.value,
        "The driver's per-cgroup GPU memory limits (NVIDIA R615+, cgroup v2, whole GPUs), programmed from quotas in "
        "evict and kill mode: where supported (auto), never (off), or as auto with /readyz failing where they "
        "cannot be applied (require).",
        _set("driver_limits", _choice(DriverLimits)),
    ),
    PolicyKey(
        "watch_interval",
        f"duration: 0s, or {MIN_WATCH_INTERVAL_S * 1000:g}ms to {MAX_WATCH_INTERVAL_S:g}s",
        "20ms",
        "How often each GPU's memory counter is read between scans; a change past watch_rise, or a GPU entering "
        "pressure, scans at once. 0s: no watch, scans on the poll alone.",
        _set("watch_interval_s", parse_watch_interval),
    ),
    PolicyKey(
        "watch_rise",
        _SIZE_OR_SHARE,
        "[256Mi, 1%]",
        "The change in a GPU's used memory since the last scan, up or down, that scans at once (the smaller of the "
        "two).",
        _bytes_or_ratio("watch_rise_bytes", "watch_rise_ratio"),
    ),
    PolicyKey(
        "triggered_scans_per_second",
        "number from 1 to 100",
        "10",
        "At most this many scans the watch calls for, a second (a burst of as many); the poll goes on as it is.",
        _set("triggered_scans_per_second", _scans_per_second),
    ),
    PolicyKey(
        "exempt_namespaces",
        "list of namespace names",
        "[kube-system]",
        "Namespaces the agent never acts on. The list replaces the default (keep kube-system in it); the agent's own "
        "namespace is always added.",
        _exempt,
    ),
    PolicyKey(
        "orphans",
        _one_of(Orphans),
        None,
        "The GPU processes of a pod that is gone: killed (reclaim) or reported (report). Unset: reclaim in kill and "
        "evict mode, report in warn mode.",
        _set("orphans", _choice(Orphans)),
    ),
    PolicyKey(
        "orphan_grace",
        f"duration, at least {MIN_ORPHAN_GRACE_S:g}s",
        "2m",
        "How long a pod must have been absent from a healthy pod cache before its processes are orphans (then "
        "confirmed by a fresh read of the API server).",
        _set("orphan_grace_s", _orphan_grace),
    ),
    PolicyKey(
        "quota_sources",
        "list of resource:<name>, annotation:<name>, env:<name> or claim:<DRA driver or device class>",
        "[" + ", ".join(DEFAULT_QUOTA_SOURCES) + "]",
        "Where a quota comes from, in precedence order: each container takes the first source that gives it a "
        "valid value.",
        lambda parser, path, value: {"quota_sources": parser.quota_sources(path, value)},
    ),
    PolicyKey(
        "default",
        f"{{kind: {_one_of(DefaultKind)}, bytes: byte quantity (kind fixed only, at least 1Mi)}}",
        f"{{kind: {DefaultKind.NONE.value}}}",
        "The quota of a container no source covers: none (unmanaged: reported, never acted on), that many bytes "
        "per container (fixed), or the GPU's memory divided by the node's nvidia.com/gpu.replicas label "
        "(fair-share).",
        lambda parser, path, value: {"default": parser.default(path, value)},
    ),
    PolicyKey(
        "namespaces",
        "mapping of namespace name to the keys below",
        "{}",
        "Per-namespace overrides.",
        lambda parser, path, value: {"namespaces": parser.namespaces(path, value)},
    ),
)
# Under `namespaces.<name>`: each overrides the top-level key of its name in that namespace (max_quota has none).
NAMESPACE_KEYS: Final = (
    PolicyKey("mode", _one_of(Mode), None, "Overrides mode.", _set("mode", _choice(Mode))),
    PolicyKey(
        "max_quota",
        "byte quantity, at least 1Mi",
        None,
        "No quota in the namespace, whatever its source, and no burst may exceed this (one that does is capped and "
        "reported). A container whose quota is missing or invalid gets the default, or where that gives none, "
        "this cap.",
        _set("max_quota_bytes", parse_quota_bytes),
    ),
    PolicyKey(
        "default",
        f"{{kind: {_one_of(DefaultKind)}, bytes: byte quantity}}",
        None,
        "Overrides default.",
        lambda parser, path, value: {"default": parser.default(path, value)},
    ),
    PolicyKey("on_repeat", _one_of(OnRepeat), None, "Overrides on_repeat.", _set("on_repeat", _choice(OnRepeat))),
)
_TOP_LEVEL: Final = {k.name: k for k in POLICY_KEYS}
_IN_NAMESPACE: Final = {k.name: k for k in NAMESPACE_KEYS}
TOP_LEVEL_FIELDS: Final = tuple(_TOP_LEVEL)
NAMESPACE_FIELDS: Final = tuple(_IN_NAMESPACE)
