"""The policy file: YAML → a validated `model.Policy`.

Every key is optional and a missing one takes the `model.Policy` default; an unknown key is an error, so a typo
never passes silently. The schema, commented: `config/policy.example.yaml`.

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
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final, TypeVar

from vramguard.core.documents import DocumentError, Scalars, load_yaml
from vramguard.core.model import (
    DefaultKind,
    DefaultQuota,
    DriverLimits,
    EvictionRefused,
    MiB,
    Mode,
    NamespacePolicy,
    OnRepeat,
    Orphans,
    Policy,
)
from vramguard.core.quantity import (
    QuantityError,
    parse_duration,
    parse_percentage,
    parse_quantity,
    parse_quota_bytes,
)
from vramguard.core.quota import parse_quota_source
from vramguard.core.text import show_value

_T = TypeVar("_T")
_E = TypeVar("_E", bound=enum.Enum)

TOP_LEVEL_FIELDS: Final = (
    "mode",
    "hard_grace",
    "soft_grace",
    "pressure_threshold",
    "pressure_transition_period",
    "max_actions_per_scan",
    "cooldown",
    "repeat_window",
    "on_repeat",
    "on_eviction_refused",
    "eviction_timeout",
    "driver_limits",
    "watch_interval",
    "watch_rise",
    "triggered_scans_per_second",
    "exempt_namespaces",
    "orphans",
    "orphan_grace",
    "quota_sources",
    "default",
    "namespaces",
)
NAMESPACE_FIELDS: Final = ("mode", "max_quota", "default", "on_repeat")
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
            if key == "mode":
                changes["mode"] = self.convert(key, value, _choice(Mode))
            elif key == "hard_grace":
                changes["hard_grace_s"] = self.convert(key, value, parse_duration)
            elif key == "soft_grace":
                changes["soft_grace_s"] = self.convert(key, value, parse_duration)
            elif key == "pressure_threshold":
                pressure = self.pressure(key, value)
                if pressure is not None:
                    changes["pressure_free_bytes"], changes["pressure_free_ratio"] = pressure
            elif key == "pressure_transition_period":
                changes["pressure_transition_s"] = self.convert(key, value, parse_duration)
            elif key == "max_actions_per_scan":
                changes["max_actions_per_scan"] = self.convert(key, value, _positive_int)
            elif key == "cooldown":
                changes["cooldown_s"] = self.convert(key, value, parse_duration)
            elif key == "repeat_window":
                changes["repeat_window_s"] = self.convert(key, value, _repeat_window)
            elif key == "on_repeat":
                changes["on_repeat"] = self.convert(key, value, _choice(OnRepeat))
            elif key == "on_eviction_refused":
                changes["on_eviction_refused"] = self.convert(key, value, _choice(EvictionRefused))
            elif key == "eviction_timeout":
                changes["eviction_timeout_s"] = self.convert(key, value, _positive_duration)
            elif key == "driver_limits":
                changes["driver_limits"] = self.convert(key, value, _choice(DriverLimits))
            elif key == "watch_interval":
                changes["watch_interval_s"] = self.convert(key, value, parse_watch_interval)
            elif key == "watch_rise":
                rise = self.pressure(key, value)
                if rise is not None:
                    changes["watch_rise_bytes"], changes["watch_rise_ratio"] = rise
            elif key == "triggered_scans_per_second":
                changes["triggered_scans_per_second"] = self.convert(key, value, _scans_per_second)
            elif key == "exempt_namespaces":
                names = self.namespace_names(key, value)
                changes["exempt_namespaces"] = frozenset(names) if names is not None else None
            elif key == "orphans":
                changes["orphans"] = self.convert(key, value, _choice(Orphans))
            elif key == "orphan_grace":
                changes["orphan_grace_s"] = self.convert(key, value, _orphan_grace)
            elif key == "quota_sources":
                changes["quota_sources"] = self.quota_sources(key, value)
            elif key == "default":
                changes["default"] = self.default(key, value)
            elif key == "namespaces":
                changes["namespaces"] = self.namespaces(key, value)
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
                field_path = _join(ns_path, key)
                if key == "mode":
                    changes["mode"] = self.convert(field_path, field_value, _choice(Mode))
                elif key == "max_quota":
                    changes["max_quota_bytes"] = self.convert(field_path, field_value, parse_quota_bytes)
                elif key == "default":
                    changes["default"] = self.default(field_path, field_value)
                elif key == "on_repeat":
                    changes["on_repeat"] = self.convert(field_path, field_value, _choice(OnRepeat))
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
