"""Kubernetes byte quantities, the peers' VRAM units, durations and percentages."""

from __future__ import annotations

import math
import re

import pytest

from vramguard.core.quantity import (
    MAX_BYTES,
    MIN_QUOTA_BYTES,
    GiB,
    MiB,
    QuantityError,
    format_duration,
    format_quantity,
    parse_count_bytes,
    parse_duration,
    parse_mib_digits,
    parse_percentage,
    parse_quantity,
    parse_quota_bytes,
    unit_bytes_for,
)

# --------------------------------------------------------------------------------------------------------------
# Byte quantities


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("12884901888", 12 * GiB, id="plain-integer-is-bytes"),
        pytest.param("0", 0, id="zero"),
        pytest.param("12Gi", 12 * GiB, id="binary-suffix-Gi"),
        pytest.param("1Ki", 1024, id="binary-suffix-Ki"),
        pytest.param("3Mi", 3 * MiB, id="binary-suffix-Mi"),
        pytest.param("2Ti", 2 * 1024**4, id="binary-suffix-Ti"),
        pytest.param("1Pi", 1024**5, id="binary-suffix-Pi"),
        pytest.param("7Ei", 7 * 1024**6, id="binary-suffix-Ei"),
        pytest.param("5k", 5_000, id="decimal-suffix-k"),
        pytest.param("12M", 12_000_000, id="decimal-suffix-M"),
        pytest.param("12G", 12_000_000_000, id="decimal-suffix-G"),
        pytest.param("1T", 10**12, id="decimal-suffix-T"),
        pytest.param("1P", 10**15, id="decimal-suffix-P"),
        pytest.param("9E", 9 * 10**18, id="decimal-suffix-E-is-exa"),
        pytest.param("12e9", 12 * 10**9, id="exponent-lowercase"),
        pytest.param("12E9", 12 * 10**9, id="exponent-uppercase-E-with-digits"),
        pytest.param("12e+9", 12 * 10**9, id="exponent-with-plus"),
        pytest.param("1500e-3", 2, id="negative-exponent-rounds-up"),
        pytest.param("1.5Gi", 1610612736, id="fraction-with-binary-suffix"),
        pytest.param("1.1Ki", 1127, id="fraction-rounds-up-to-whole-byte"),
        pytest.param("1.5", 2, id="fractional-bytes-round-up-like-Value"),
        pytest.param("0.1", 1, id="tiny-positive-rounds-up-to-one-byte"),
        pytest.param("1e-999", 1, id="vanishing-positive-rounds-up-to-one-byte"),
        pytest.param(".5Ki", 512, id="leading-dot"),
        pytest.param("2.", 2, id="trailing-dot"),
        pytest.param("+1Gi", GiB, id="explicit-plus-sign"),
        pytest.param("-0", 0, id="negative-zero-is-zero"),
        pytest.param("9223372036854775807", MAX_BYTES, id="int64-max-is-accepted"),
        pytest.param(17179869184, 16 * GiB, id="yaml-int"),
        pytest.param(1.5e9, 1_500_000_000, id="yaml-float"),
    ],
)
def test_parse_quantity_accepts(value: str | int | float, expected: int) -> None:
    """Valid Kubernetes byte quantities parse to the bytes Quantity.Value() gives."""
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    ("value", "reason_part"),
    [
        pytest.param("12GB", "write 12Gi or 12884901888 for 12 GiB, or 12G for 12e9 bytes", id="GB-is-not-a-suffix"),
        pytest.param("12GiB", "write 12Gi or 12884901888", id="GiB-is-not-a-suffix"),
        pytest.param("12gi", "case-sensitive; write 12Gi", id="lowercase-gi-rejected"),
        pytest.param("12g", "write 12G (10^9) or 12Gi (2^30)", id="lowercase-g-rejected"),
        pytest.param("12K", "write 12k (10^3) or 12Ki (2^10)", id="uppercase-K-rejected"),
        pytest.param("12m", "milli", id="milli-rejected-as-likely-typo-for-M"),
        pytest.param("12n", "nano", id="nano-rejected"),
        pytest.param("-1", "must not be negative", id="negative-rejected"),
        pytest.param("-1.5Gi", "must not be negative", id="negative-fraction-rejected"),
        pytest.param(-5, "must not be negative", id="negative-yaml-int-rejected"),
        pytest.param("abc", "expected a number", id="letters-rejected"),
        pytest.param("", "empty", id="empty-rejected"),
        pytest.param(".", "expected a number", id="lone-dot-rejected"),
        pytest.param(" 12Gi", "whitespace", id="leading-whitespace-rejected"),
        pytest.param("12Gi ", "whitespace", id="trailing-whitespace-rejected"),
        pytest.param("12 Gi", "whitespace", id="inner-whitespace-rejected"),
        pytest.param("9223372036854775808", "int64 maximum", id="int64-overflow-rejected"),
        pytest.param("8Ei", "int64 maximum", id="Ei-overflow-rejected"),
        pytest.param("1e999999999", "int64 maximum", id="huge-exponent-rejected-without-computing-it"),
        pytest.param("12e", "exponent needs digits", id="exponent-without-digits-rejected"),
        pytest.param("1.5.5", "unknown suffix", id="two-dots-rejected"),
        pytest.param("1Gi1", "unknown suffix", id="trailing-garbage-rejected"),
        pytest.param("NaN", "expected a number", id="nan-string-rejected"),
        pytest.param("inf", "expected a number", id="inf-string-rejected"),
        pytest.param(math.nan, "not a finite number", id="nan-float-rejected"),
        pytest.param(math.inf, "not a finite number", id="inf-float-rejected"),
        pytest.param(True, "boolean", id="yaml-bool-rejected"),
        pytest.param(None, "expected a string or a number", id="null-rejected"),
        pytest.param("1" * 65, "longer than 64", id="overlong-rejected"),
    ],
)
def test_parse_quantity_rejects(value: object, reason_part: str) -> None:
    """Invalid quantities raise QuantityError carrying the value and a reason that says how to fix it."""
    with pytest.raises(QuantityError) as info:
        parse_quantity(value)
    assert info.value.value == value or (isinstance(value, float) and math.isnan(value))
    assert reason_part in info.value.reason
    assert "is not a valid quantity" in str(info.value)


@pytest.mark.parametrize(
    ("value", "name", "unit_bytes", "reason"),
    [
        pytest.param(
            "1.5GB",
            "",
            1,
            "GB is not a Kubernetes suffix; write 1.5Gi for 1.5 GiB, or 1.5G for 1.5e9 bytes",
            id="a-fraction-names-no-bytes",
        ),
        pytest.param(
            "12.0gi", "", 1, "suffixes are case-sensitive; write 12.0Gi or 12884901888", id="a-zero-fraction-does"
        ),
        pytest.param(
            "9EB", "", 1, "EB is not a Kubernetes suffix; write 9Ei for 9 EiB, or 9E for 9e18 bytes", id="past-int64"
        ),
        pytest.param(
            "1.5Gi",
            "gpu-memory",
            MiB,
            "gpu-memory is a count of MiB, not a byte quantity",
            id="a-fraction-names-no-count",
        ),
        pytest.param(
            "9Ei",
            "gpu-memory",
            MiB,
            "gpu-memory is a count of MiB, not a byte quantity",
            id="bytes-past-int64-no-count",
        ),
        pytest.param(
            "0Gi", "gpu-memory", MiB, "gpu-memory is a count of MiB, not a byte quantity; write 0 for 0Gi", id="zero"
        ),
    ],
)
def test_a_hint_names_bytes_only_of_a_whole_number_within_int64(
    value: str, name: str, unit_bytes: int, reason: str
) -> None:
    """The bytes or count a hint suggests is given only for a whole number whose bytes fit int64: what the chart's
    admission policy can say the same in CEL (its words are the agent's)."""
    with pytest.raises(QuantityError) as info:
        parse_count_bytes(value, unit_bytes, name or "the value")
    assert info.value.reason == reason


def test_quantity_error_quotes_the_value() -> None:
    """The message shows string values in double quotes, so empty and padded values stay visible."""
    with pytest.raises(QuantityError, match=r'^" 1Gi" is not a valid quantity \(contains whitespace; write "1Gi"\)$'):
        parse_quantity(" 1Gi")


@pytest.mark.parametrize(
    ("n_bytes", "expected"),
    [
        pytest.param(0, "0", id="zero"),
        pytest.param(16 * GiB, "16Gi", id="largest-exact-binary-suffix"),
        pytest.param(1536 * MiB, "1536Mi", id="fraction-of-Gi-stays-exact-in-Mi"),
        pytest.param(12_000_000_000, "12G", id="decimal-when-binary-is-inexact"),
        pytest.param(1234567, "1234567", id="plain-when-no-suffix-is-exact"),
    ],
)
def test_format_quantity(n_bytes: int, expected: str) -> None:
    """Bytes format to the shortest exact Kubernetes spelling, which parses back to the same bytes."""
    assert format_quantity(n_bytes) == expected
    assert parse_quantity(expected) == n_bytes


# --------------------------------------------------------------------------------------------------------------
# Peers' units


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        pytest.param("vramguard.io/vram", "12Gi", 12 * GiB, id="vramguard-resource-is-bytes"),
        pytest.param("vramguard.io/vram-limit", "12e9", 12 * 10**9, id="vramguard-annotation-is-bytes"),
        pytest.param("vramguard.io/vram-burst", "16Gi", 16 * GiB, id="burst-annotation-is-bytes"),
        pytest.param("aliyun.com/gpu-mem", "3", 3 * GiB, id="aliyun-gpu-mem-counts-GiB"),
        pytest.param("nvidia.com/gpumem", "3000", 3000 * MiB, id="hami-gpumem-counts-MiB"),
        pytest.param("tencent.com/vcuda-memory", "4", 4 * 256 * MiB, id="tencent-vcuda-256Mi-units"),
        pytest.param("gpu-memory", "2000", 2000 * MiB, id="kai-gpu-memory-counts-MiB"),
        pytest.param("nvidia.com/gpumem", "2k", 2000 * MiB, id="count-with-decimal-suffix-like-kubernetes"),
        pytest.param("nvidia.com/gpumem", "1", MiB, id="one-MiB-count-is-the-smallest-quota"),
    ],
)
def test_parse_resource_bytes(name: str, value: str, expected: int) -> None:
    """Each known name converts its value with its own unit."""
    assert _parse_resource(name, value) == expected


@pytest.mark.parametrize(
    ("name", "value", "reason_part"),
    [
        pytest.param("nvidia.com/gpumem", "1.5", "count of MiB: must be a whole number", id="fractional-count"),
        pytest.param("gpu-memory", "2Gi", "not a byte quantity; write 2048 for 2Gi", id="byte-suffix-on-a-count"),
        pytest.param("aliyun.com/gpu-mem", "-3", "must not be negative", id="negative-count"),
        pytest.param("aliyun.com/gpu-mem", "9999999999", "int64 maximum", id="count-overflows-int64-in-bytes"),
        pytest.param("tencent.com/vcuda-memory", "4GB", "not a Kubernetes suffix", id="bad-suffix-on-a-count"),
        pytest.param("nvidia.com/gpumem", "0", "must be at least 1Mi", id="zero-count-is-below-the-minimum-quota"),
        pytest.param("vramguard.io/vram", "100", "must be at least 1Mi", id="byte-quota-below-the-minimum"),
    ],
)
def test_parse_resource_bytes_rejects(name: str, value: str, reason_part: str) -> None:
    """Invalid counts raise QuantityError that names the unit where it matters."""
    with pytest.raises(QuantityError) as info:
        _parse_resource(name, value)
    assert info.value.value == value
    assert reason_part in info.value.reason


@pytest.mark.parametrize(
    ("value", "unit_bytes", "expected", "reason_part"),
    [
        pytest.param("0", 1, None, "must be at least 1Mi (1048576 bytes), not 0 bytes", id="zero-bytes-rejected"),
        pytest.param("-0", 1, None, "must be at least 1Mi", id="negative-zero-rejected"),
        pytest.param(0, 1, None, "must be at least 1Mi", id="yaml-int-zero-rejected"),
        pytest.param("0.5", 1, None, "not 1 bytes", id="half-a-byte-rounds-to-one-and-is-rejected"),
        pytest.param("100", 1, None, "must be at least 1Mi", id="hundred-bytes-rejected"),
        pytest.param("1023Ki", 1, None, "must be at least 1Mi", id="just-under-1Mi-rejected"),
        pytest.param("1M", 1, None, "must be at least 1Mi", id="decimal-mega-is-under-1Mi"),
        pytest.param("12m", 1, None, "m means milli (10^-3) bytes; write 12M", id="milli-keeps-its-own-hint"),
        pytest.param("-1Gi", 1, None, "must not be negative", id="negative-keeps-its-own-reason"),
        pytest.param("1Mi", 1, MiB, None, id="1Mi-accepted"),
        pytest.param("1048576", 1, MiB, None, id="1048576-bytes-accepted"),
        pytest.param("1048575.5", 1, MiB, None, id="rounded-up-like-Value-to-1Mi-accepted"),
        pytest.param("0", MiB, None, "must be at least 1Mi", id="zero-MiB-count-rejected"),
        pytest.param("-0", GiB, None, "must be at least 1Mi", id="negative-zero-GiB-count-rejected"),
        pytest.param("1", MiB, MiB, None, id="one-MiB-count-accepted"),
        pytest.param("1", 256 * MiB, 256 * MiB, None, id="one-256MiB-unit-accepted"),
    ],
)
def test_parse_quota_bytes_minimum(value: object, unit_bytes: int, expected: int | None, reason_part: str) -> None:
    """A quota is at least MIN_QUOTA_BYTES whatever its unit; smaller values are QuantityErrors that say so."""
    if expected is not None:
        assert parse_quota_bytes(value, unit_bytes) == expected >= MIN_QUOTA_BYTES
        return
    with pytest.raises(QuantityError) as info:
        parse_quota_bytes(value, unit_bytes)
    assert info.value.value == value
    assert reason_part in info.value.reason


@pytest.mark.parametrize("value", [pytest.param("0", id="zero"), pytest.param("-0", id="negative-zero")])
def test_parse_quantity_still_accepts_zero(value: str) -> None:
    """Quantities that are not quotas (a pressure threshold, a capacity reserve) may be 0."""
    assert parse_quantity(value) == 0


def test_unknown_resource_name_has_no_unit() -> None:
    """A name whose unit vramguard does not know has none, never a guess."""
    assert unit_bytes_for("example.com/vram") is None


def _parse_resource(name: str, value: str) -> int:
    """A quota value as the quota resolver reads it: in the unit of its resource or annotation."""
    unit = unit_bytes_for(name)
    assert unit is not None
    return parse_quota_bytes(value, unit, name)


# --------------------------------------------------------------------------------------------------------------
# Durations and percentages


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("0s", 0.0, id="zero-seconds"),
        pytest.param("500ms", 0.5, id="milliseconds"),
        pytest.param("30s", 30.0, id="seconds"),
        pytest.param("5m", 300.0, id="minutes"),
        pytest.param("1h", 3600.0, id="hours"),
        pytest.param("1m30s", 90.0, id="compound-go-style"),
        pytest.param("1.5s", 1.5, id="fractional-seconds"),
        pytest.param("30", 30.0, id="plain-string-number-is-seconds"),
        pytest.param(30, 30.0, id="yaml-int-is-seconds"),
        pytest.param(0.25, 0.25, id="yaml-float-is-seconds"),
    ],
)
def test_parse_duration(value: object, expected: float) -> None:
    """Durations parse to float seconds."""
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    ("value", "reason_part"),
    [
        pytest.param("-1s", "must not be negative", id="negative-string"),
        pytest.param(-1, "must not be negative", id="negative-number"),
        pytest.param("abc", "expected a number of seconds", id="letters"),
        pytest.param("", "expected a number of seconds", id="empty"),
        pytest.param("30 s", "expected a number of seconds", id="whitespace"),
        pytest.param("1h30", "expected a number of seconds", id="trailing-number-without-unit"),
        pytest.param("2d", "expected a number of seconds", id="days-unsupported"),
        pytest.param(math.inf, "not a finite number", id="inf"),
        pytest.param(10**400, "not a finite number", id="int-beyond-float"),
        pytest.param(True, "boolean", id="bool"),
        pytest.param(None, "expected a string or a number", id="null"),
    ],
)
def test_parse_duration_rejects(value: object, reason_part: str) -> None:
    """Invalid durations raise QuantityError naming the value."""
    with pytest.raises(QuantityError) as info:
        parse_duration(value)
    assert info.value.what == "duration"
    assert reason_part in info.value.reason
    assert "is not a valid duration" in str(info.value)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        pytest.param(0.0, "0s", id="zero"),
        pytest.param(45.0, "45s", id="seconds"),
        pytest.param(60.0, "1m", id="whole-minutes"),
        pytest.param(7200.0, "2h", id="whole-hours"),
        pytest.param(90.0, "90s", id="not-whole-minutes"),
        pytest.param(0.5, "500ms", id="sub-second-in-ms"),
        pytest.param(1.5, "1.5s", id="fractional-seconds"),
        pytest.param(0.1 + 0.2, "0.30000000000000004s", id="inexact-float-round-trips"),
    ],
)
def test_format_duration_round_trips(seconds: float, expected: str) -> None:
    """Durations format to a readable string that parses back to exactly the same float."""
    assert format_duration(seconds) == expected
    assert parse_duration(expected) == seconds


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("5%", 0.05, id="whole-percent"),
        pytest.param("2.5%", 0.025, id="fractional-percent"),
        pytest.param("0%", 0.0, id="zero"),
        pytest.param("100%", 1.0, id="hundred"),
    ],
)
def test_parse_percentage(value: str, expected: float) -> None:
    """Percentages parse to a ratio."""
    assert parse_percentage(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("101%", id="above-hundred"),
        pytest.param("-5%", id="negative"),
        pytest.param("5", id="no-percent-sign"),
        pytest.param("five%", id="not-a-number"),
        pytest.param(5, id="yaml-int"),
    ],
)
def test_parse_percentage_rejects(value: object) -> None:
    """Anything but a number from 0 to 100 followed by % is an error naming the value."""
    with pytest.raises(QuantityError, match="is not a valid percentage"):
        parse_percentage(value)


@pytest.mark.parametrize(
    ("value", "expected", "reason"),
    [
        pytest.param("4096", 4 * GiB, None, id="whole-mib"),
        pytest.param("0010", 10 * MiB, None, id="leading-zeros-as-go-parses-them"),
        pytest.param("1", MiB, None, id="one-mib-the-smallest-quota"),
        pytest.param("0", None, "must be at least 1Mi", id="zero"),
        pytest.param("2048MiB", None, "write 2048 for 2048MiB", id="unit-written-out"),
        pytest.param("2Gi", None, "write 2048 for 2Gi", id="a-quantity"),
        pytest.param("12GB", None, "digits alone", id="not-a-quantity-either"),
        pytest.param("+4096", None, "digits alone", id="sign"),
        pytest.param(" 4096", None, "digits alone", id="space"),
        pytest.param("1.5", None, "digits alone", id="decimal"),
        pytest.param("", None, "digits alone", id="empty"),
        pytest.param("9" * 19, None, "int64 maximum", id="past-int64-in-bytes"),
        pytest.param("9" * 65, None, "longer than 64 characters", id="long"),
    ],
)
def test_the_toolkits_mib_are_digits_alone(value: str, expected: int | None, reason: str | None) -> None:
    """NVIDIA_GPU_MEMORY_LIMIT as the toolkit's hook reads it (Go's ParseUint, base 10), and at least 1 MiB."""
    if expected is not None:
        assert parse_mib_digits(value, "NVIDIA_GPU_MEMORY_LIMIT") == expected
        return
    with pytest.raises(QuantityError, match=re.escape(reason or "")):
        parse_mib_digits(value, "NVIDIA_GPU_MEMORY_LIMIT")
