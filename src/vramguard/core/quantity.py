"""Units of measure: Kubernetes byte quantities, the peers' VRAM units, durations and percentages.

Byte quantities are read as Kubernetes' `resource.ParseQuantity` then `Quantity.Value()` read them, stricter
where a quota that parses to something the user did not mean is worse than an error; a quota is at least
`MIN_QUOTA_BYTES`. The grammar and each strictness: `docs/architecture.md` "Quantities".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, localcontext
from fractions import Fraction
from types import MappingProxyType
from typing import Final

from vramguard.core.text import show_value

GiB = 1024**3


MiB = 1024**2


MAX_BYTES: Final = 2**63 - 1  # the int64 behind a Kubernetes Quantity
# The smallest quota: below it no GPU workload runs at all (`docs/architecture.md` "Quantities").
MIN_QUOTA_BYTES: Final = MiB
# Long enough for any honest quantity (19 digits plus a suffix); bounds the work and the error messages.
MAX_LENGTH: Final = 64

_BINARY_SUFFIXES: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}  # power of 2
_DECIMAL_SUFFIXES: Final = {"": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}  # power of 10

_NUMBER = re.compile(r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?P<suffix>.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE](?P<exp>[+-]?[0-9]+)")

# Bytes per unit of each name vramguard reads a quota from. 1 means a byte quantity (`12Gi`).
RESOURCE_UNIT_BYTES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "vramguard.io/vram": 1,
        "aliyun.com/gpu-mem": GiB,  # gpushare
        "nvidia.com/gpumem": MiB,  # HAMi
        "tencent.com/vcuda-memory": 256 * MiB,  # Tencent gpu-manager
    }
)
ANNOTATION_UNIT_BYTES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "vramguard.io/vram-limit": 1,
        "vramguard.io/vram-burst": 1,
        "gpu-memory": MiB,  # KAI scheduler / Run:ai
    }
)


# The environment variables NVIDIA's container toolkit reads a container's GPU memory from (its
# apply-cuda-memory-limits hook, toolkit 1.20.1, R615+): REQUEST the soft limit, LIMIT the hard one, each a whole
# number of MiB. The hook parses each with Go's strconv.ParseUint(value, 10, 64): digits only, and refuses to start the
# container on anything else.
ENV_UNIT_BYTES: Final[Mapping[str, int]] = MappingProxyType({"NVIDIA_GPU_MEMORY": MiB})
ENV_REQUEST_SUFFIX: Final = "_REQUEST"
ENV_LIMIT_SUFFIX: Final = "_LIMIT"
_DIGITS = re.compile(r"[0-9]+")
_MIB_SPELLED = re.compile(r"([0-9]{1,19}) ?MiB")  # the unit written out, as people do


class QuantityError(ValueError):
    """A value that is not a valid quantity, duration or percentage. `str()` names the value and the reason."""

    def __init__(self, value: object, reason: str, what: str = "quantity") -> None:
        self.value = value
        self.reason = reason
        self.what = what
        super().__init__(f"{show_value(value)} is not a valid {what} ({reason})")


# --------------------------------------------------------------------------------------------------------------
# Byte quantities


def parse_quantity(value: object) -> int:
    """A Kubernetes quantity of bytes → bytes, rounded up to a whole byte. Ints and floats come from YAML.

    Takes any object because it validates untrusted input: anything but a string or a number is an error.

    Raises QuantityError naming the value and what is wrong with it.
    """
    exact, _ = _parse_exact(value)
    return _whole_bytes(value, math.ceil(exact))


def _whole_bytes(value: object, n_bytes: int) -> int:
    if n_bytes > MAX_BYTES:
        raise QuantityError(value, f"larger than the int64 maximum of {MAX_BYTES} bytes")
    return n_bytes


def _parse_exact(value: object) -> tuple[Fraction, int]:
    """The exact, non-negative value of a quantity before any rounding, and the power of 2 of its binary suffix
    (0 when it has none)."""
    if isinstance(value, bool):  # bool is an int subclass; `true` in YAML is never meant as 1 byte
        raise QuantityError(value, "a boolean, not a number")
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(value, "must not be negative")
        return Fraction(value), 0
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(value, "not a finite number")
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise QuantityError(value, f"expected a string or a number, got {type(value).__name__}")

    if not text:
        raise QuantityError(value, "empty")
    if len(text) > MAX_LENGTH:
        raise QuantityError(value, f"longer than {MAX_LENGTH} characters")
    if any(ch.isspace() for ch in text):
        raise QuantityError(value, f"contains whitespace; write {show_value(''.join(text.split()))}")

    m = _NUMBER.fullmatch(text)
    assert m is not None  # every part of the pattern is optional
    whole, frac, suffix = m["whole"], m["frac"] or "", m["suffix"]
    if not whole and not frac:
        raise QuantityError(value, "expected a number with an optional suffix, e.g. 12Gi, 12G, 12884901888 or 12e9")
    number = whole + ("." + frac if frac else "")
    base, exponent = _interpret_suffix(value, number, suffix)
    mantissa = Fraction(number)
    binary_power = exponent if base == 2 else 0
    if mantissa == 0:
        return Fraction(0), binary_power
    if m["sign"] == "-":
        raise QuantityError(value, "must not be negative")

    # The mantissa lies within 10^±MAX_LENGTH, so an exponent past twice that settles the outcome without
    # computing a number with a billion digits ("1e999999999").
    if exponent > 2 * MAX_LENGTH:
        raise QuantityError(value, f"larger than the int64 maximum of {MAX_BYTES} bytes")
    if exponent < -2 * MAX_LENGTH:
        return Fraction(1, 10 ** (2 * MAX_LENGTH)), 0
    return mantissa * Fraction(base) ** exponent, binary_power


def _interpret_suffix(value: object, number: str, suffix: str) -> tuple[int, int]:
    """(base, exponent) of a suffix, or a QuantityError that says what the user probably meant."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix]
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix]
    exp = _EXPONENT.fullmatch(suffix)
    if exp is not None:
        return 10, int(exp["exp"])
    raise QuantityError(value, _suffix_hint(number, suffix))


def _suffix_hint(number: str, suffix: str) -> str:
    """Why `suffix` is wrong, with the spelling the user most likely meant."""
    if suffix == "m":
        return f"m means milli (10^-3) bytes; write {number}M (10^6) or {number}Mi (2^20)"
    if suffix in {"u", "n"}:
        return f"{suffix} means {'micro (10^-6)' if suffix == 'u' else 'nano (10^-9)'} bytes, not a whole byte count"
    if suffix in {"e", "E+", "E-", "e+", "e-"}:
        return f"an exponent needs digits, e.g. {number}e9"
    letter, rest = suffix[:1].upper(), suffix[1:].lower()
    if letter and letter in "KMGTPE" and rest in {"", "i", "ib", "b"}:
        binary = letter + "i"
        decimal = "k" if letter == "K" else letter
        power = _DECIMAL_SUFFIXES[decimal]
        exact = Fraction(number) * 2 ** _BINARY_SUFFIXES[binary]
        spelled = f"{number}{binary}" + (f" or {exact}" if _whole_within_int64(Fraction(number), exact) else "")
        if rest == "":
            binary_power = _BINARY_SUFFIXES[binary]
            return (
                f"suffixes are case-sensitive; write {number}{decimal} (10^{power}) "
                f"or {number}{binary} (2^{binary_power})"
            )
        if rest == "i":
            return f"suffixes are case-sensitive; write {spelled}"
        if rest == "ib":
            return f"{suffix} is not a Kubernetes suffix; write {spelled}"
        return (
            f"{suffix} is not a Kubernetes suffix; write {spelled} for {number} {binary}B, "
            f"or {number}{decimal} for {number}e{power} bytes"
        )
    return (
        f"unknown suffix {show_value(suffix)}; Kubernetes suffixes are Ki Mi Gi Ti Pi Ei (binary), "
        "k M G T P E (decimal) and e<N> (exponent), case-sensitive"
    )


def _whole_within_int64(number: Fraction, exact: Fraction) -> bool:
    """Whether a hint may name the bytes (`exact`) of `number` of a binary unit: the number is whole and the bytes
    fit an int64. The chart's admission policy says the same in CEL, which has no numbers beyond int64."""
    return number.denominator == 1 and exact <= MAX_BYTES


def format_quantity(n_bytes: int) -> str:
    """Bytes → the shortest exact Kubernetes spelling: 17179869184 → "16Gi", 12000000000 → "12G", 1000 → "1k".

    Binary wins a tie, as people size GPU memory in GiB.
    """
    if n_bytes < 0:
        raise ValueError(f"negative byte count {n_bytes}")
    candidates = [str(n_bytes)]
    for suffixes, base in ((_BINARY_SUFFIXES, 2), (_DECIMAL_SUFFIXES, 10)):
        for suffix, power in sorted(suffixes.items(), key=lambda kv: -kv[1]):
            if power and n_bytes and n_bytes % base**power == 0:
                candidates.insert(-1, f"{n_bytes // base**power}{suffix}")
                break
    return min(candidates, key=len)


# --------------------------------------------------------------------------------------------------------------
# Peers' units


def unit_bytes_for(name: str) -> int | None:
    """Bytes per unit for a known resource or annotation name; 1 for a byte quantity, None when unknown."""
    return RESOURCE_UNIT_BYTES.get(name, ANNOTATION_UNIT_BYTES.get(name))


def _unit_name(unit_bytes: int) -> str:
    return {MiB: "MiB", GiB: "GiB", 256 * MiB: "256 MiB units"}.get(unit_bytes, f"{unit_bytes}-byte units")


def parse_count_bytes(value: object, unit_bytes: int, name: str = "the value") -> int:
    """A whole number of `unit_bytes` units → bytes; a byte quantity when `unit_bytes` is 1.

    `name` says, in errors, whose unit it is. Raises QuantityError naming the value.
    """
    if unit_bytes == 1:
        return parse_quantity(value)
    unit = _unit_name(unit_bytes)
    exact, binary_power = _parse_exact(value)
    if binary_power:
        units, rest = divmod(math.ceil(exact), unit_bytes)
        whole = _whole_within_int64(exact / 2**binary_power, exact)
        hint = f"; write {units} for {value}" if whole and not rest else ""
        raise QuantityError(value, f"{name} is a count of {unit}, not a byte quantity{hint}")
    if exact.denominator != 1:
        raise QuantityError(value, f"{name} is a count of {unit}: must be a whole number")
    return _whole_bytes(value, int(exact) * unit_bytes)


def parse_quota_bytes(value: object, unit_bytes: int = 1, name: str = "the value") -> int:
    """A quota: `parse_count_bytes`, then at least MIN_QUOTA_BYTES. Raises QuantityError naming the value.

    The minimum is checked on the bytes the value means (`1048575.5` rounds up to 1Mi, as `Value()` does).
    """
    n_bytes = parse_count_bytes(value, unit_bytes, name)
    if n_bytes < MIN_QUOTA_BYTES:
        raise QuantityError(
            value,
            f"a quota must be at least {format_quantity(MIN_QUOTA_BYTES)} ({MIN_QUOTA_BYTES} bytes), "
            f"not {n_bytes} bytes: no GPU workload fits in it",
        )
    return n_bytes


def parse_mib_digits(value: object, name: str) -> int:
    """A whole number of MiB written in digits alone, as NVIDIA's toolkit reads `name` (`NVIDIA_GPU_MEMORY_LIMIT`):
    bytes, at least MIN_QUOTA_BYTES. Raises QuantityError naming the value; where the value is a Kubernetes quantity
    of whole MiB (`2048Mi`, `2Gi`), the error says the digits to write instead."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_LENGTH:
        raise QuantityError(value, f"longer than {MAX_LENGTH} characters")
    if not _DIGITS.fullmatch(text):
        hint = ""
        try:
            n_bytes = parse_quantity(text)
        except QuantityError:
            n_bytes = -1
        if n_bytes > 0 and n_bytes % MiB == 0:
            hint = f"; write {n_bytes // MiB} for {text}"
        elif (mib := _MIB_SPELLED.fullmatch(text)) is not None:
            hint = f"; write {int(mib.group(1))} for {text}"
        reason = f"{name} is a whole number of MiB in digits alone, as NVIDIA's toolkit reads it{hint}"
        raise QuantityError(value, reason)
    n_bytes = _whole_bytes(value, int(text) * MiB)
    if n_bytes < MIN_QUOTA_BYTES:
        raise QuantityError(
            value,
            f"a quota must be at least {format_quantity(MIN_QUOTA_BYTES)} ({MIN_QUOTA_BYTES} bytes), "
            f"not {n_bytes} bytes: no GPU workload fits in it",
        )
    return n_bytes


# --------------------------------------------------------------------------------------------------------------
# Durations and percentages (the policy file)

_DURATION_UNITS: Final = {"ms": Fraction(1, 1000), "s": Fraction(1), "m": Fraction(60), "h": Fraction(3600)}
_DECIMAL = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_DURATION_PART = re.compile(rf"({_DECIMAL})(ms|s|m|h)")
_DURATION = re.compile(rf"(?:{_DECIMAL}(?:ms|s|m|h))+")
_PLAIN_NUMBER = re.compile(_DECIMAL)


def parse_duration(value: object) -> float:
    """`0s`, `500ms`, `30s`, `5m`, `1h`, `1m30s`, or a plain number of seconds → seconds.

    Raises QuantityError naming the value.
    """
    if isinstance(value, bool):
        raise QuantityError(value, "a boolean, not a number", "duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise QuantityError(value, "must not be negative", "duration")
        try:
            seconds = float(value)
        except OverflowError:  # an int with hundreds of digits
            seconds = math.inf
        if not math.isfinite(seconds):
            raise QuantityError(value, "not a finite number", "duration")
        return seconds
    if not isinstance(value, str):
        raise QuantityError(value, f"expected a string or a number, got {type(value).__name__}", "duration")
    if value.startswith("-"):
        raise QuantityError(value, "must not be negative", "duration")
    if len(value) > MAX_LENGTH:
        raise QuantityError(value, f"longer than {MAX_LENGTH} characters", "duration")
    if _PLAIN_NUMBER.fullmatch(value):
        return float(Fraction(value))
    if not _DURATION.fullmatch(value):
        raise QuantityError(
            value, "expected a number of seconds or a number with a unit ms, s, m or h, e.g. 30s, 5m, 1m30s", "duration"
        )
    total = sum(
        (Fraction(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(value)), Fraction(0)
    )
    return float(total)


def format_duration(seconds: float) -> str:
    """Seconds → a duration that `parse_duration` reads back exactly: 60.0 → "1m", 0.5 → "500ms", 1.5 → "1.5s".

    Exact for any duration from a microsecond to centuries; beyond, the spelling outgrows MAX_LENGTH.
    """
    if seconds.is_integer():
        whole = int(seconds)
        if whole and whole % 3600 == 0:
            return f"{whole // 3600}h"
        if whole and whole % 60 == 0:
            return f"{whole // 60}m"
        return f"{whole}s"
    millis = seconds * 1000
    if seconds < 1 and millis.is_integer() and float(Fraction(int(millis), 1000)) == seconds:
        return f"{int(millis)}ms"
    # The shortest fixed-point spelling that reads back as exactly these seconds.
    for digits in range(20):
        text = f"{seconds:.{digits}f}s"
        if parse_duration(text) == seconds:
            return text
    with localcontext() as ctx:
        ctx.prec = 2000  # enough to hold any double exactly, so this spelling always reads back
        return f"{Decimal(seconds):f}s"


def parse_percentage(value: object) -> float:
    """`5%` or `2.5%` → a ratio in [0, 1]. Raises QuantityError naming the value."""
    if not isinstance(value, str) or not value.endswith("%"):
        raise QuantityError(value, "expected a percentage such as 5%", "percentage")
    number = value[:-1]
    if not _PLAIN_NUMBER.fullmatch(number):
        raise QuantityError(value, "expected a non-negative number followed by %, such as 5%", "percentage")
    ratio = Fraction(number) / 100
    if ratio > 1:
        raise QuantityError(value, "must be at most 100%", "percentage")
    return float(ratio)
