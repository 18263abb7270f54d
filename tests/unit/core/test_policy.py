"""The policy file: parsing, validation with every error named, loading, and printing back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vramguard.base.policyfile import load_policy, read_policy
from vramguard.core.policy import (
    DEFAULT_QUOTA_SOURCES,
    NAMESPACE_KEYS,
    POLICY_KEYS,
    TOP_LEVEL_FIELDS,
    DefaultKind,
    DefaultQuota,
    DriverLimits,
    EvictionRefused,
    Mode,
    NamespacePolicy,
    OnRepeat,
    Overrides,
    Policy,
    PolicyError,
    PolicyKey,
    PolicyText,
    parse_policy,
    policy_from_text,
)
from vramguard.core.quantity import GiB
from vramguard.core.sample import GpuDevice, GpuMemory
from vramguard_testbed.configmap import ConfigMapVolume

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml"


def errors_of(data: object) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(data)
    return [str(e) for e in info.value.errors]


# --------------------------------------------------------------------------------------------------------------
# Valid policies


def test_example_file_parses() -> None:
    """The shipped example is a valid policy and means what its comments say."""
    policy = load_policy(EXAMPLE)
    assert policy.mode is Mode.WARN
    assert policy.pressure_free_ratio == 0.05
    assert policy.pressure_free_bytes is None
    assert policy.quota_sources == DEFAULT_QUOTA_SOURCES
    assert policy.namespaces["team-a"] == NamespacePolicy(
        mode=Mode.KILL,
        max_quota_bytes=16 * GiB,
        default=DefaultQuota(DefaultKind.FIXED, 4 * GiB),
        on_repeat=OnRepeat.EVICT,
    )
    assert policy.mode_for("team-a") is Mode.KILL
    assert policy.on_repeat_for("team-a") is OnRepeat.EVICT
    assert policy.on_repeat_for("ml") is OnRepeat.KILL_CONTAINER
    assert policy.cap_for("team-a") == 16 * GiB
    assert policy.eviction_timeout_s == 15.0


def test_example_file_sets_every_field() -> None:
    """The example shows every top-level field, so it documents the whole schema."""
    data = yaml.safe_load(EXAMPLE.read_text())
    assert list(data) == list(TOP_LEVEL_FIELDS)


@pytest.mark.parametrize(
    "key", [k for k in POLICY_KEYS if k.default is not None], ids=lambda k: f"{k.name}-{k.default}"
)
def test_each_keys_default_spells_the_policys_default(key: PolicyKey) -> None:
    """The default the table shows for a key (and docs/reference/policy.md with it) is the one the agent uses."""
    assert policy_from_text(PolicyText(f"{key.name}: {key.default}\n".encode()), "table") == Policy()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("on_repeat: kill-container", "on_repeat", id="on-repeat-follows-the-mode"),
        pytest.param("orphans: report", "orphans", id="orphans-follow-the-mode"),
    ],
)
def test_a_key_without_a_spelled_default_is_unset_until_set(text: str, expected: str) -> None:
    """The keys whose default no value spells are None in `Policy()` and set by any value: `doc` says what unset
    means."""
    assert [k.name for k in POLICY_KEYS if k.default is None] == ["on_repeat", "orphans"]
    assert getattr(Policy(), expected) is None
    assert getattr(parse_policy(yaml.safe_load(text)), expected) is not None


def test_namespace_keys_are_the_namespace_policys_fields() -> None:
    """Each key under namespaces.<name> sets its own NamespacePolicy field, and every field has a key."""
    entry = {"mode": "kill", "max_quota": "2Gi", "default": {"kind": "fair-share"}, "on_repeat": "wait"}
    assert [k.name for k in NAMESPACE_KEYS] == list(entry)
    assert parse_policy({"namespaces": {"a": entry}}).namespaces["a"] == NamespacePolicy(
        Mode.KILL, 2 * GiB, DefaultQuota(DefaultKind.FAIR_SHARE), OnRepeat.WAIT
    )


def test_empty_mapping_is_the_default_policy() -> None:
    """Missing keys take the Policy dataclass defaults."""
    assert parse_policy({}) == Policy()


def test_empty_file_is_the_default_policy(tmp_path: Path) -> None:
    """An empty file (e.g. a ConfigMap key with only comments) is the default policy."""
    path = tmp_path / "policy.yaml"
    path.write_text("# nothing set\n")
    assert load_policy(path) == Policy()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param({"mode": "evict"}, Policy(mode=Mode.EVICT), id="mode"),
        pytest.param({"hard_grace": "500ms"}, Policy(hard_grace_s=0.5), id="hard-grace-ms"),
        pytest.param({"soft_grace": "5m"}, Policy(soft_grace_s=300.0), id="soft-grace-minutes"),
        pytest.param({"cooldown": 30}, Policy(cooldown_s=30.0), id="cooldown-plain-seconds"),
        pytest.param({"cooldown": "0s"}, Policy(cooldown_s=0.0), id="cooldown-zero-is-allowed"),
        pytest.param({"repeat_window": "10m"}, Policy(repeat_window_s=600.0), id="repeat-window"),
        pytest.param({"repeat_window": 10}, Policy(repeat_window_s=10.0), id="repeat-window-at-its-minimum"),
        pytest.param({"watch_interval": "5ms"}, Policy(watch_interval_s=0.005), id="watch-interval"),
        pytest.param({"watch_interval": "0s"}, Policy(watch_interval_s=0.0), id="watch-off-scans-on-the-poll"),
        pytest.param(
            {"watch_rise": "1Gi"}, Policy(watch_rise_bytes=GiB, watch_rise_ratio=None), id="watch-rise-as-bytes"
        ),
        pytest.param(
            {"watch_rise": ["512Mi", "2%"]},
            Policy(watch_rise_bytes=512 * 1024 * 1024, watch_rise_ratio=0.02),
            id="watch-rise-the-smaller-of-both",
        ),
        pytest.param({"triggered_scans_per_second": 3}, Policy(triggered_scans_per_second=3.0), id="triggered-rate"),
        pytest.param(
            {"pressure_threshold": "2Gi"},
            Policy(pressure_free_bytes=2 * GiB, pressure_free_ratio=None),
            id="pressure-as-bytes-replaces-the-default-percentage",
        ),
        pytest.param({"pressure_threshold": "10%"}, Policy(pressure_free_ratio=0.1), id="pressure-as-percentage"),
        pytest.param(
            {"pressure_threshold": ["2Gi", "5%"]},
            Policy(pressure_free_bytes=2 * GiB, pressure_free_ratio=0.05),
            id="pressure-as-both",
        ),
        pytest.param(
            {"pressure_threshold": []},
            Policy(pressure_free_bytes=None, pressure_free_ratio=None),
            id="pressure-off",
        ),
        pytest.param(
            {"pressure_threshold": "0"},
            Policy(pressure_free_bytes=0, pressure_free_ratio=None),
            id="pressure-bytes-may-be-zero-it-is-not-a-quota",
        ),
        pytest.param({"max_actions_per_scan": 3}, Policy(max_actions_per_scan=3), id="max-actions"),
        pytest.param({"eviction_timeout": "30s"}, Policy(eviction_timeout_s=30.0), id="eviction-timeout"),
        pytest.param({"eviction_timeout": 0.5}, Policy(eviction_timeout_s=0.5), id="eviction-timeout-plain-seconds"),
        pytest.param(
            {"on_eviction_refused": "kill"}, Policy(on_eviction_refused=EvictionRefused.KILL), id="eviction-refused"
        ),
        pytest.param({"driver_limits": "require"}, Policy(driver_limits=DriverLimits.REQUIRE), id="driver-limits"),
        pytest.param({"driver_limits": "off"}, Policy(driver_limits=DriverLimits.OFF), id="driver-limits-off"),
        pytest.param({"on_repeat": "wait"}, Policy(on_repeat=OnRepeat.WAIT), id="on-repeat"),
        pytest.param({"on_repeat": "kill-container"}, Policy(on_repeat=OnRepeat.KILL_CONTAINER), id="on-repeat-kill"),
        pytest.param(
            {"namespaces": {"serving": {"on_repeat": "evict"}}},
            Policy(namespaces={"serving": NamespacePolicy(on_repeat=OnRepeat.EVICT)}),
            id="on-repeat-per-namespace",
        ),
        pytest.param(
            {"exempt_namespaces": ["monitoring"]},
            Policy(exempt_namespaces=frozenset({"monitoring"})),
            id="exempt-list-replaces-the-default",
        ),
        pytest.param(
            {"quota_sources": ["annotation:gpu-memory", "resource:vramguard.io/vram"]},
            Policy(quota_sources=("annotation:gpu-memory", "resource:vramguard.io/vram")),
            id="quota-sources-in-given-order",
        ),
        pytest.param({"quota_sources": []}, Policy(quota_sources=()), id="no-quota-sources"),
        pytest.param(
            {"default": {"kind": "fixed", "bytes": "8Gi"}},
            Policy(default=DefaultQuota(DefaultKind.FIXED, 8 * GiB)),
            id="default-fixed",
        ),
        pytest.param(
            {"default": {"kind": "fair-share"}},
            Policy(default=DefaultQuota(DefaultKind.FAIR_SHARE)),
            id="default-fair-share",
        ),
        pytest.param(
            {"default": {"kind": "fixed", "bytes": "1Mi"}, "namespaces": {"team-b": {"max_quota": 1048576}}},
            Policy(
                default=DefaultQuota(DefaultKind.FIXED, 2**20),
                namespaces={"team-b": NamespacePolicy(max_quota_bytes=2**20)},
            ),
            id="1Mi-is-the-smallest-quota",
        ),
        pytest.param(
            {"namespaces": {"team-b": {"max_quota": 17179869184}}},
            Policy(namespaces={"team-b": NamespacePolicy(max_quota_bytes=16 * GiB)}),
            id="namespace-cap-as-yaml-int",
        ),
        pytest.param(
            {"namespaces": {"team-b": {}}},
            Policy(namespaces={"team-b": NamespacePolicy()}),
            id="namespace-with-no-overrides",
        ),
    ],
)
def test_parse_policy_fields(data: dict[str, object], expected: Policy) -> None:
    """Each field maps onto its Policy attribute; everything else keeps its default."""
    assert parse_policy(data) == expected


# --------------------------------------------------------------------------------------------------------------
# Invalid policies: every error names the field path and the value


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param({"mode": "wran"}, 'mode: "wran" must be one of warn, evict, kill', id="mode-typo"),
        pytest.param(
            {"namespaces": {"team-a": {"max_quota": "16GB"}}},
            'namespaces.team-a.max_quota: "16GB" is not a valid quantity (GB is not a Kubernetes suffix; '
            "write 16Gi or 17179869184",
            id="namespace-cap-GB",
        ),
        pytest.param(
            {"hard_grace": "5 minutes"}, 'hard_grace: "5 minutes" is not a valid duration', id="duration-words"
        ),
        pytest.param(
            {"soft_grace": -1}, "soft_grace: -1 is not a valid duration (must not be negative)", id="negative"
        ),
        pytest.param({"cooldown": "1d"}, 'cooldown: "1d" is not a valid duration', id="duration-days"),
        pytest.param(
            {"repeat_window": "0s"},
            'repeat_window: "0s" must be at least 10s (a shorter window switches off the repeat rule)',
            id="repeat-window-zero-would-switch-the-defence-off",
        ),
        pytest.param(
            {"watch_interval": "500us"}, 'watch_interval: "500us" is not a valid duration', id="watch-interval-unit"
        ),
        pytest.param(
            {"watch_interval": 0.0005},
            "watch_interval: 0.0005 must be 0s (no watch: scans on the poll alone) or from 1ms to 1s",
            id="watch-interval-a-busy-loop",
        ),
        pytest.param(
            {"watch_interval": "2s"}, 'watch_interval: "2s" must be 0s (no watch', id="watch-interval-no-watch-at-all"
        ),
        pytest.param({"watch_rise": "-1Gi"}, 'watch_rise: "-1Gi" is not a valid quantity', id="watch-rise-negative"),
        pytest.param(
            {"triggered_scans_per_second": 0},
            "triggered_scans_per_second: 0 must be a number from 1 to 100 (to scan on the poll alone, set "
            "watch_interval: 0s)",
            id="triggered-rate-zero-is-not-an-off-switch",
        ),
        pytest.param(
            {"triggered_scans_per_second": "many"},
            'triggered_scans_per_second: "many" must be a number from 1 to 100',
            id="triggered-rate-words",
        ),
        pytest.param(
            {"repeat_window": "9.5s"}, 'repeat_window: "9.5s" must be at least 10s', id="repeat-window-too-short"
        ),
        pytest.param(
            {"repeat_window": "-1m"},
            'repeat_window: "-1m" is not a valid duration (must not be negative)',
            id="repeat-window-negative",
        ),
        pytest.param({"eviction_timeout": "0s"}, 'eviction_timeout: "0s" must be longer than 0s', id="timeout-zero"),
        pytest.param({"eviction_timeout": 0}, "eviction_timeout: 0 must be longer than 0s", id="timeout-int-zero"),
        pytest.param(
            {"eviction_timeout": "-5s"},
            'eviction_timeout: "-5s" is not a valid duration (must not be negative)',
            id="timeout-negative",
        ),
        pytest.param(
            {"eviction_timeout": "soon"}, 'eviction_timeout: "soon" is not a valid duration', id="timeout-words"
        ),
        pytest.param(
            {"pressure_threshold": "150%"},
            'pressure_threshold: "150%" is not a valid percentage (must be at most 100%)',
            id="pressure-over-100",
        ),
        pytest.param(
            {"pressure_threshold": "lots"}, 'pressure_threshold: "lots" is not a valid quantity', id="pressure-words"
        ),
        pytest.param(
            {"pressure_threshold": ["5%", "10%"]},
            'pressure_threshold[1]: "10%" is a second percentage',
            id="pressure-two-percentages",
        ),
        pytest.param({"max_actions_per_scan": 0}, "max_actions_per_scan: 0 must be at least 1", id="max-actions-zero"),
        pytest.param(
            {"max_actions_per_scan": "1"}, 'max_actions_per_scan: "1" must be a whole number', id="max-actions-string"
        ),
        pytest.param(
            {"max_actions_per_scan": True}, "max_actions_per_scan: true must be a whole number", id="max-actions-bool"
        ),
        pytest.param(
            {"on_eviction_refused": "retry"},
            'on_eviction_refused: "retry" must be one of wait, kill',
            id="eviction-refused-unknown",
        ),
        pytest.param(
            {"on_repeat": "kill"},
            'on_repeat: "kill" must be one of kill-container, evict, wait',
            id="on-repeat-unknown",
        ),
        pytest.param(
            {"namespaces": {"serving": {"on_repeat": None}}},
            "namespaces.serving.on_repeat: null must be one of kill-container, evict, wait",
            id="on-repeat-per-namespace-null",
        ),
        pytest.param(
            {"driver_limits": "sometimes"},
            'driver_limits: "sometimes" must be one of auto, off, require',
            id="driver-limits-unknown",
        ),
        pytest.param(
            {"exempt_namespaces": "kube-system"},
            'exempt_namespaces: "kube-system" is not a list',
            id="exempt-not-a-list",
        ),
        pytest.param(
            {"exempt_namespaces": ["kube-system", "Kube_System"]},
            'exempt_namespaces[1]: "Kube_System" is not a valid namespace name',
            id="exempt-bad-name",
        ),
        pytest.param(
            {"quota_sources": ["resource:example.com/vram"]},
            'quota_sources[0]: "resource:example.com/vram" is not a quota source',
            id="source-unknown-unit",
        ),
        pytest.param(
            {"quota_sources": ["resource:vramguard.io/vram", "resource:vramguard.io/vram"]},
            'quota_sources[1]: "resource:vramguard.io/vram" is listed twice (first at quota_sources[0])',
            id="source-duplicate",
        ),
        pytest.param({"default": "none"}, 'default: "none" is not a mapping', id="default-not-a-mapping"),
        pytest.param({"default": {}}, "default.kind: is required", id="default-without-kind"),
        pytest.param(
            {"default": {"kind": "fair"}}, 'default.kind: "fair" must be one of none, fixed, fair-share', id="kind"
        ),
        pytest.param(
            {"default": {"kind": "fixed"}}, "default.bytes: is required when kind is fixed", id="fixed-needs-bytes"
        ),
        pytest.param(
            {"default": {"kind": "none", "bytes": "8Gi"}},
            'default.bytes: "8Gi" is only allowed with kind fixed, not none',
            id="bytes-only-with-fixed",
        ),
        pytest.param(
            {"default": {"kind": "fixed", "bytes": "8gb"}},
            'default.bytes: "8gb" is not a valid quantity',
            id="fixed-bytes-invalid",
        ),
        pytest.param(
            {"namespaces": {"team-a": {"default": {"kind": "fixed", "bytes": -1}}}},
            "namespaces.team-a.default.bytes: -1 is not a valid quantity (must not be negative)",
            id="nested-default-path",
        ),
        pytest.param(
            {"namespaces": {"Team_A": {}}}, 'namespaces: "Team_A" is not a valid namespace name', id="ns-bad-name"
        ),
        pytest.param({"namespaces": {"team-a": None}}, "namespaces.team-a: null is not a mapping", id="ns-entry-empty"),
        pytest.param(
            {"namespaces": {"team-a": {"mode": "nuke"}}},
            'namespaces.team-a.mode: "nuke" must be one of warn, evict, kill',
            id="ns-mode",
        ),
        pytest.param(
            {"namespaces": {"team-a": {"max_qouta": "1Gi"}}},
            "namespaces.team-a.max_qouta: is not a known field (did you mean max_quota?)",
            id="ns-unknown-field",
        ),
        pytest.param(
            {"hard_grace_s": 1}, "hard_grace_s: is not a known field (did you mean hard_grace?)", id="unknown-field"
        ),
        pytest.param({"colour": "red"}, "colour: is not a known field (known fields: mode,", id="unknown-no-match"),
        pytest.param({True: "x"}, "true is not a string key (quote it)", id="yaml-1.1-boolean-key"),
        pytest.param(["mode", "warn"], '["mode", "warn"] is not a mapping with the fields mode,', id="not-a-mapping"),
    ],
)
def test_invalid_policy_names_field_and_value(data: object, expected: str) -> None:
    """Each invalid input yields one error whose text starts with the field path and shows the value."""
    errors = errors_of(data)
    assert len(errors) == 1, errors
    assert errors[0].startswith(expected), errors[0]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            {"default": {"kind": "fixed", "bytes": 0}},
            "default.bytes: 0 is not a valid quantity (a quota must be at least 1Mi (1048576 bytes), not 0 bytes",
            id="default-bytes-zero",
        ),
        pytest.param(
            {"default": {"kind": "fixed", "bytes": "-0"}},
            'default.bytes: "-0" is not a valid quantity (a quota must be at least 1Mi',
            id="default-bytes-negative-zero",
        ),
        pytest.param(
            {"namespaces": {"team-a": {"default": {"kind": "fixed", "bytes": "1023Ki"}}}},
            'namespaces.team-a.default.bytes: "1023Ki" is not a valid quantity (a quota must be at least 1Mi',
            id="namespace-default-bytes-under-1Mi",
        ),
        pytest.param(
            {"namespaces": {"team-a": {"max_quota": "0.5"}}},
            'namespaces.team-a.max_quota: "0.5" is not a valid quantity (a quota must be at least 1Mi (1048576 '
            "bytes), not 1 bytes",
            id="max-quota-half-a-byte",
        ),
        pytest.param(
            {"namespaces": {"team-a": {"max_quota": 100}}},
            "namespaces.team-a.max_quota: 100 is not a valid quantity (a quota must be at least 1Mi",
            id="max-quota-hundred-bytes",
        ),
        pytest.param(
            {"namespaces": {"team-a": {"max_quota": "12m"}}},
            'namespaces.team-a.max_quota: "12m" is not a valid quantity (m means milli (10^-3) bytes; write 12M',
            id="max-quota-milli-keeps-its-hint",
        ),
    ],
)
def test_quota_fields_must_be_at_least_1mi(data: object, expected: str) -> None:
    """default.bytes and max_quota are quotas: under 1 MiB is an error naming the field, as for a pod's quota."""
    errors = errors_of(data)
    assert len(errors) == 1, errors
    assert errors[0].startswith(expected), errors[0]


def test_all_errors_are_reported() -> None:
    """Every problem is collected, not just the first."""
    errors = errors_of(
        {
            "mode": "wran",
            "cooldown": "soon",
            "quota_sources": ["resource:vramguard.io/vram", "label:x"],
            "namespaces": {"team-a": {"max_quota": "16GB", "mode": "nuke"}, "team-b": {"default": {"kind": "fixed"}}},
            "extra": 1,
        }
    )
    paths = sorted(e.split(":")[0] for e in errors)
    assert paths == [
        "cooldown",
        "extra",
        "mode",
        "namespaces.team-a.max_quota",
        "namespaces.team-a.mode",
        "namespaces.team-b.default.bytes",
        "quota_sources[1]",
    ]


def test_policy_error_text_lists_every_error() -> None:
    """str(PolicyError) is readable: a count, then one indented line per error."""
    with pytest.raises(PolicyError) as info:
        parse_policy({"mode": "wran", "cooldown": "soon"})
    assert str(info.value).splitlines() == [
        "invalid policy (2 errors):",
        '  mode: "wran" must be one of warn, evict, kill',
        '  cooldown: "soon" is not a valid duration (expected a number of seconds or a number with a unit ms, s, '
        "m or h, e.g. 30s, 5m, 1m30s)",
    ]


# --------------------------------------------------------------------------------------------------------------
# Files


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("mode: [warn\n", "is not valid YAML: line 2, column 1", id="not-yaml"),
        pytest.param("mode: warn\nmode: kill\n", "is not valid YAML: line 2: duplicate key 'mode'", id="duplicate-key"),
        pytest.param(
            "namespaces:\n  team-a: {mode: kill}\n  team-b:\n    <<: {mode: kill}\n",
            "is not valid YAML: line 4: YAML merge keys (<<) are not allowed",
            id="merge-key-refused",
        ),
        pytest.param(
            "namespaces:\n  team-a: &base {mode: kill}\n  team-b: *base\n",
            "is not valid YAML: line 2: YAML anchors and aliases are not allowed",
            id="anchor-refused",
        ),
        pytest.param("hard_grace: " + "[" * 65 + "]" * 65, "line 1: nested deeper than 64 levels", id="too-deep"),
        pytest.param("- mode\n", '["mode"] is not a mapping', id="top-level-list"),
        pytest.param("just text\n", '"just text" is not a mapping', id="top-level-scalar"),
        pytest.param("mode: wran\n", 'mode: "wran" must be one of', id="invalid-field"),
        pytest.param("!!python/object:os.system {}\n", "is not valid YAML: line 1: YAML tag", id="unsafe-tag-refused"),
    ],
)
def test_load_policy_errors_name_the_file(tmp_path: Path, text: str, expected: str) -> None:
    """Unreadable, non-YAML, non-mapping and invalid files raise PolicyError naming the file and the problem."""
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.source == str(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_yaml_1_1_numbers_are_numbers(tmp_path: Path) -> None:
    """The policy's plain scalars are typed as YAML 1.1 types them: a fractional rate is a number, not text."""
    path = tmp_path / "policy.yaml"
    path.write_text("triggered_scans_per_second: 2.5\nmax_actions_per_scan: 3\n")
    policy = load_policy(path)
    assert (policy.triggered_scans_per_second, policy.max_actions_per_scan) == (2.5, 3)


# --------------------------------------------------------------------------------------------------------------
# Every field at once


EVERY_FIELD = """
mode: evict
hard_grace: 500ms
soft_grace: 1m30s
pressure_threshold: [3G, 2.5%]
pressure_transition_period: 2m
max_actions_per_scan: 3
cooldown: 2h
on_eviction_refused: kill
eviction_timeout: 2.5s
exempt_namespaces: [b, a]
quota_sources: [annotation:gpu-memory]
default: {kind: fair-share}
namespaces:
  x: {mode: warn}
  y: {max_quota: 1536Mi}
"""


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        pytest.param("{}", Policy(), id="defaults"),
        pytest.param(
            EVERY_FIELD,
            Policy(
                mode=Mode.EVICT,
                hard_grace_s=0.5,
                soft_grace_s=90.0,
                pressure_free_bytes=3 * 10**9,
                pressure_free_ratio=0.025,
                pressure_transition_s=120.0,
                max_actions_per_scan=3,
                cooldown_s=7200.0,
                on_eviction_refused=EvictionRefused.KILL,
                eviction_timeout_s=2.5,
                exempt_namespaces=frozenset({"b", "a"}),
                quota_sources=("annotation:gpu-memory",),
                default=DefaultQuota(DefaultKind.FAIR_SHARE),
                namespaces={"x": NamespacePolicy(mode=Mode.WARN), "y": NamespacePolicy(max_quota_bytes=1536 * 2**20)},
            ),
            id="every-field-set",
        ),
        pytest.param(
            "pressure_threshold: []", Policy(pressure_free_bytes=None, pressure_free_ratio=None), id="no-pressure"
        ),
        pytest.param("pressure_transition_period: 0s", Policy(pressure_transition_s=0.0), id="leave-pressure-at-once"),
    ],
)
def test_every_field_reads_into_the_policy(text: str, policy: Policy) -> None:
    """Each field of the schema lands in its Policy attribute, in the unit the agent uses."""
    assert parse_policy(yaml.safe_load(text)) == policy


@pytest.mark.parametrize("value", ["-5s", "soon", True, [30]])
def test_pressure_transition_period_must_be_a_duration(value: object) -> None:
    """A pressure_transition_period that is no non-negative duration is one PolicyError naming the field and value."""
    with pytest.raises(PolicyError) as info:
        parse_policy({"pressure_transition_period": value})
    (error,) = info.value.errors
    assert error.path == "pressure_transition_period" and error.value == value


def test_overrides_set_the_flags_over_the_file_and_exempt_the_agents_namespace() -> None:
    file = Policy(mode=Mode.WARN, driver_limits=DriverLimits.REQUIRE, watch_interval_s=0.05)
    assert Overrides().apply(file) == file, "no flag: the file's values"
    got = Overrides(Mode.KILL, DriverLimits.OFF, 0.0, "vramguard-system").apply(file)
    assert (got.mode, got.driver_limits, got.watch_interval_s) == (Mode.KILL, DriverLimits.OFF, 0.0)
    assert got.exempt_namespaces == {"kube-system", "vramguard-system"}


def test_read_policy_gives_the_bytes_it_read(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"mode: evict\n")
    assert read_policy(path) == (Policy(mode=Mode.EVICT), PolicyText(b"mode: evict\n"))


# --------------------------------------------------------------------------------------------------------------
# Policy ConfigMaps: the document, and the fields the admission policy reads too in keys of their own


def config_map_errors(data: dict[str, str]) -> list[str]:
    with pytest.raises(PolicyError) as info:
        policy_from_text(PolicyText.of_config_map(data), "cm")
    return [str(e) for e in info.value.errors]


def test_a_config_map_directory_is_the_document_and_the_door_keys(tmp_path: Path) -> None:
    """Mounted as the kubelet mounts it, a ConfigMap is read whole: the keys that the admission policy reads too
    are the fields they name (a list apart by spaces, commas or line breaks), beside the document's own."""
    ConfigMapVolume(
        tmp_path,
        {
            "policy.yaml": "mode: kill\nnamespaces:\n  team-a: {mode: warn}\n",
            "exempt_namespaces": "kube-system, gpu-infra\nops",
            "quota_sources": "annotation:gpu-memory resource:nvidia.com/gpumem",
            "namespaces.team-a.max_quota": "16Gi",
            "namespaces.team-b.max_quota": "17179869184",
        },
    )
    policy = load_policy(tmp_path)
    assert policy.mode is Mode.KILL
    assert policy.exempt_namespaces == {"kube-system", "gpu-infra", "ops"}
    assert policy.quota_sources == ("annotation:gpu-memory", "resource:nvidia.com/gpumem")
    assert policy.namespaces["team-a"] == NamespacePolicy(mode=Mode.WARN, max_quota_bytes=16 * GiB)
    assert policy.cap_for("team-b") == 16 * GiB


def test_a_config_map_without_door_keys_has_the_defaults_and_without_a_document_the_keys_alone() -> None:
    """A missing key is the field's default, as the admission policy takes it; so is a missing document."""
    assert policy_from_text(PolicyText.of_config_map({"policy.yaml": "mode: kill\n"}), "cm") == Policy(mode=Mode.KILL)
    only_a_cap = policy_from_text(PolicyText.of_config_map({"namespaces.ml.max_quota": "8Gi"}), "cm")
    assert only_a_cap == Policy(namespaces={"ml": NamespacePolicy(max_quota_bytes=8 * GiB)})


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param(
            "namespaces:\n  team-a: {mode: kill, max_quota: 8Gi}\n",
            'policy.yaml: namespaces.team-a.max_quota: "8Gi" belongs in the ConfigMap\'s key'
            " namespaces.team-a.max_quota, which the admission policy reads too, not in policy.yaml",
            id="a-cap-in-the-document",
        ),
        pytest.param(
            "exempt_namespaces: [kube-system, ml]\n",
            'policy.yaml: exempt_namespaces: ["kube-system", "ml"] belongs in the ConfigMap\'s key exempt_namespaces',
            id="exemptions-in-the-document",
        ),
        pytest.param(
            "quota_sources: []\n",
            "policy.yaml: quota_sources: [] belongs in the ConfigMap's key quota_sources",
            id="sources-in-the-document",
        ),
    ],
)
def test_a_door_field_in_a_config_maps_document_is_refused(document: str, expected: str) -> None:
    """In a ConfigMap, a field the admission policy reads is read from its own key only: written in the document,
    the door would not see it, so the agent refuses the policy (the last good one stays in force) and says where
    it belongs."""
    (error,) = config_map_errors({"policy.yaml": document, "namespaces.team-a.max_quota": "16Gi"})
    assert error.startswith(expected), error


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        pytest.param(
            "namespace.ml.max_quota",
            "8Gi",
            "namespace.ml.max_quota: is not a key of a policy ConfigMap (policy.yaml, exempt_namespaces,"
            " quota_sources, namespaces.<namespace>.max_quota)",
            id="a-misspelt-key",
        ),
        pytest.param("mode", "kill", "mode: is not a key of a policy ConfigMap", id="a-field-of-the-document"),
        pytest.param(
            "namespaces.ml.max_quota", "8GB", 'namespaces.ml.max_quota: "8GB" is not a valid quantity', id="a-bad-cap"
        ),
        pytest.param(
            "namespaces.ml.max_quota",
            " 8Gi",
            'namespaces.ml.max_quota: " 8Gi" is not a valid quantity',
            id="a-cap-spaced",
        ),
        pytest.param(
            "namespaces.ML.max_quota", "8Gi", 'namespaces: "ML" is not a valid namespace name', id="a-bad-namespace"
        ),
        pytest.param(
            "exempt_namespaces",
            "kube-system;ml",
            'exempt_namespaces[0]: "kube-system;ml" is not a valid',
            id="a-bad-list",
        ),
        pytest.param(
            "quota_sources",
            "resource:example.com/vram",
            'quota_sources[0]: "resource:example.com/vram" is not a',
            id="a-bad-source",
        ),
    ],
)
def test_a_bad_key_of_a_config_map_is_refused_by_its_name(key: str, value: str, expected: str) -> None:
    """A key that names no field the admission policy reads, or holds what the field cannot be, is an error that
    names the key as the ConfigMap spells it."""
    (error,) = config_map_errors({"policy.yaml": "mode: kill\n", key: value})
    assert error.startswith(expected), error


def test_a_config_maps_content_is_every_key() -> None:
    """A reload compares every key: a changed cap is a change, and no two ConfigMaps read alike."""
    base = {"policy.yaml": "mode: kill\n", "namespaces.ml.max_quota": "8Gi"}
    content = PolicyText.of_config_map(base).content
    assert PolicyText.of_config_map({**base, "namespaces.ml.max_quota": "9Gi"}).content != content
    assert PolicyText.of_config_map({**base, "exempt_namespaces": ""}).content != content
    assert PolicyText.of_config_map({"policy.yaml": "mode: kill\nnamespaces.ml.max_quota8Gi"}).content != content
    assert PolicyText(b"mode: kill\n").content == b"mode: kill\n", "a file's content is its bytes"


def test_a_config_map_directory_is_read_from_one_version(tmp_path: Path) -> None:
    """Every key comes through the kubelet's `..data` link: a key added or removed by an update is seen with the
    version that has it."""
    volume = ConfigMapVolume(tmp_path, {"policy.yaml": "mode: kill\n", "namespaces.ml.max_quota": "8Gi"})
    assert load_policy(tmp_path).cap_for("ml") == 8 * GiB
    volume.update({"policy.yaml": "mode: kill\n"})
    assert load_policy(tmp_path).cap_for("ml") is None
    (tmp_path / "namespaces.ml.max_quota").symlink_to("..data/policy.yaml")  # a stale link outside `..data`
    assert load_policy(tmp_path).cap_for("ml") is None


def test_the_docs_config_map_is_a_policy() -> None:
    """docs/rollout.md "Changing the policy" shows a policy ConfigMap's data: the agent reads it as it says."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "rollout.md").read_text()
    section = doc[doc.index("The chart's ConfigMap is the policy in two parts") :]
    start = section.index("```yaml\n") + len("```yaml\n")
    block = section[start : section.index("\n```", start)]
    policy = policy_from_text(PolicyText.of_config_map(yaml.safe_load(block)["data"]), "docs/rollout.md")
    assert policy.mode is Mode.KILL and policy.exempt_namespaces == {"kube-system", "gpu-infra"}
    assert policy.namespaces["team-a"] == NamespacePolicy(mode=Mode.WARN, max_quota_bytes=16 * GiB)
    assert policy.quota_sources == ("resource:vramguard.io/vram", "annotation:vramguard.io/vram-limit")


AGENT_UID = "a9e1c0de-0000-4000-8000-000000000001"


POD_UID = "5f3c2b1a-0000-4000-8000-000000000002"


def device(used_gib: int, total_gib: int = 80) -> GpuDevice:
    total, used = total_gib * GiB, used_gib * GiB
    return GpuDevice(index=0, uuid="GPU-0", name="H100", total_bytes=total, used_bytes=used, free_bytes=total - used)


@pytest.mark.parametrize(
    ("pod_uid", "namespace", "agent_pod_uid", "exempt"),
    [
        pytest.param(POD_UID, "ml", AGENT_UID, None, id="a-tenant-pod-may-be-acted-on"),
        pytest.param(AGENT_UID, "vramguard-system", AGENT_UID, "the agent's own pod", id="the-agents-own-pod"),
        pytest.param(AGENT_UID, "ml", AGENT_UID, "the agent's own pod", id="the-agents-pod-wherever-it-runs"),
        pytest.param(POD_UID, "kube-system", AGENT_UID, "namespace kube-system is exempt", id="an-exempt-namespace"),
        pytest.param(POD_UID, "kube-system", None, "namespace kube-system is exempt", id="exempt-with-no-agent-pod"),
        pytest.param(POD_UID, "ml", None, None, id="no-agent-pod-known-exempts-nobody-else"),
    ],
)
def test_exemption_is_the_agents_own_pod_or_an_exempt_namespace(
    pod_uid: str, namespace: str, agent_pod_uid: str | None, exempt: str | None
) -> None:
    """The one rule decide, the driver limits and the orphan reclaim go by: never the agent's pod, nor a pod in
    an exempt namespace (kube-system by default); the agent's own pod is named first."""
    assert Policy().exemption(pod_uid, namespace, agent_pod_uid) == exempt


def test_exempt_namespaces_come_from_the_policy() -> None:
    """The policy's list replaces the default: kube-system is exempt only while it is listed."""
    policy = Policy(exempt_namespaces=frozenset({"monitoring"}))
    assert policy.exemption(POD_UID, "monitoring") == "namespace monitoring is exempt"
    assert policy.exemption(POD_UID, "kube-system") is None


@pytest.mark.parametrize(
    ("policy", "used_gib", "pressure"),
    [
        pytest.param(Policy(), 75, False, id="default-5-percent-free-is-not-pressure"),
        pytest.param(Policy(), 77, True, id="default-under-5-percent-free"),
        pytest.param(Policy(pressure_free_bytes=10 * GiB, pressure_free_ratio=None), 69, False, id="bytes-not-met"),
        pytest.param(Policy(pressure_free_bytes=10 * GiB, pressure_free_ratio=None), 71, True, id="bytes-met"),
        pytest.param(Policy(pressure_free_bytes=1 * GiB), 77, True, id="either-threshold-set-counts"),
        pytest.param(Policy(pressure_free_ratio=None), 80, False, id="no-threshold-no-pressure"),
    ],
)
def test_pressure_is_free_memory_under_either_threshold(policy: Policy, used_gib: int, pressure: bool) -> None:
    """A GPU is under pressure when its free memory is below the byte or the ratio threshold, whichever is set."""
    assert policy.under_pressure(device(used_gib)) is pressure
    assert policy.under_pressure(GpuMemory(0, 80 * GiB, used_gib * GiB, (80 - used_gib) * GiB)) is pressure


@pytest.mark.parametrize(
    ("policy", "rise_bytes"),
    [
        pytest.param(Policy(), 256 * 1024 * 1024, id="default-the-smaller-of-256mib-and-1-percent"),
        pytest.param(Policy(watch_rise_bytes=4 * GiB), int(0.01 * 80 * GiB), id="the-ratio-when-smaller"),
        pytest.param(Policy(watch_rise_ratio=None), 256 * 1024 * 1024, id="bytes-alone"),
        pytest.param(Policy(watch_rise_bytes=None), int(0.01 * 80 * GiB), id="ratio-alone"),
        pytest.param(Policy(watch_rise_bytes=None, watch_rise_ratio=None), 80 * GiB, id="neither-the-whole-gpu"),
    ],
)
def test_the_watch_scans_at_once_on_the_smaller_rise(policy: Policy, rise_bytes: int) -> None:
    """The change in used memory that triggers a scan: the smaller threshold set, the whole GPU when none is."""
    assert policy.watch_rise_for(80 * GiB) == rise_bytes
