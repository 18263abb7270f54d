"""One table of quota values, valid and invalid, for every field the agent reads a quota from.

The agent judges each row in tests/unit/core/test_quota.py; the chart's admission policy judges the same rows on a
real kube-apiserver in tests/cluster/test_quota_admission.py, which expects exactly the agent's words. A row is one
value in one field of a pod with one container ("main"), in a namespace with the row's max_quota or none; a row of
one half of a request and limit pair (NVIDIA's variables, KAI's per-container annotations) may set the other half too
(`partner`), and names the half the agent reports.

`valid` is the agent's verdict on the value as written. A resource value that is not a Kubernetes quantity, or not a
whole non-negative number, never reaches the admission policy: the API server refuses the pod itself (400 for a
value that does not decode, 422 for validation), so such rows say `api_server_refuses` and are only asserted to be
refused. Resource values the API server admits it stores in its canonical spelling (`1.5Gi` as `1536Mi`), and that
is what the agent and the policy read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from vramguard.core.quantity import GiB, MiB

VRAM = "vramguard.io/vram"
ALIYUN = "aliyun.com/gpu-mem"
HAMI = "nvidia.com/gpumem"
TENCENT = "tencent.com/vcuda-memory"
LIMIT = "vramguard.io/vram-limit"
KAI = "gpu-memory"
BURST = "vramguard.io/vram-burst"
KAI_REQUEST = "nvidia.com/container.main.gpu-memory.request"
KAI_LIMIT = "nvidia.com/container.main.gpu-memory.limit"
ENV_REQUEST = "NVIDIA_GPU_MEMORY_REQUEST"
ENV_LIMIT = "NVIDIA_GPU_MEMORY_LIMIT"
PARTNERS = {KAI_REQUEST: KAI_LIMIT, KAI_LIMIT: KAI_REQUEST, ENV_REQUEST: ENV_LIMIT, ENV_LIMIT: ENV_REQUEST}


@dataclass(frozen=True)
class Field:
    """A place a pod writes a quota: a container's resources.limits[name], the pod's annotation `name`, or a
    container's env[] variable `name`."""

    kind: str  # "resource", "annotation" or "env"
    name: str
    unit_bytes: int  # 1 for a byte quantity
    short: str  # for test ids

    def pod(
        self, value: str | None, name: str = "p", namespace: str = "default", partner: str | None = None
    ) -> dict[str, Any]:
        """A Pod manifest with `value` in this field (None: a variable set by a valueFrom) and `partner`, where given,
        in the other half of its pair (a burst comes with the smallest quota, 1Mi, to extend)."""
        values = {self.name: value, **({PARTNERS[self.name]: partner} if partner is not None else {})}
        limits = {self.name: value} if self.kind == "resource" else {}
        annotations = {k: v for k, v in values.items() if self.kind == "annotation"}
        env = [_env_entry(k, v) for k, v in values.items() if self.kind == "env"]
        if self.name == BURST:
            annotations[LIMIT] = "1Mi"
        container: dict[str, Any] = {"name": "main", "image": "busybox", "resources": {"limits": limits}}
        if env:
            container["env"] = sorted(env, key=lambda e: e["name"])  # the request first
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"containers": [container]},
        }

    @property
    def path(self) -> str:
        """The field as the agent's VRAMQuotaInvalid names it."""
        if self.kind == "resource":
            return f"spec.containers[main].resources.limits[{self.name}]"
        if self.kind == "env":
            return f"spec.containers[main].env[{self.name}]"
        return f"metadata.annotations[{self.name}]"

    @property
    def pod_wide(self) -> bool:
        """Whether its quota covers the whole pod (an annotation of the pod's own), not its container alone."""
        return self.kind == "annotation" and self.name not in PARTNERS


def _env_entry(name: str, value: str | None) -> dict[str, Any]:
    """An env[] entry: a literal value, or (None) one from a ConfigMap's key."""
    if value is None:
        return {"name": name, "valueFrom": {"configMapKeyRef": {"name": "gpu", "key": name}}}
    return {"name": name, "value": value}


FIELDS = (
    Field("resource", VRAM, 1, "vram"),
    Field("resource", ALIYUN, GiB, "aliyun"),
    Field("resource", HAMI, MiB, "hami"),
    Field("resource", TENCENT, 256 * MiB, "tencent"),
    Field("annotation", LIMIT, 1, "vram-limit"),
    Field("annotation", KAI, MiB, "gpu-memory"),
    Field("annotation", BURST, 1, "burst"),
    Field("annotation", KAI_REQUEST, 1, "kai-request"),
    Field("annotation", KAI_LIMIT, 1, "kai-limit"),
    Field("env", ENV_REQUEST, MiB, "env-request"),
    Field("env", ENV_LIMIT, MiB, "env-limit"),
)
BY_NAME = {f.name: f for f in FIELDS}

# The max_quota of each capped namespace, as written in the chart's values (policy.namespaces.<ns>.max_quota): the
# agent names it as format_quantity spells it ("16Gi" for each of the first two).
CAPS: dict[str, object] = {
    "16Gi": "16Gi",
    "bytes": 17179869184,  # a YAML number
    "12e9": "12e9",
    "1.5Gi": "1.5Gi",
}


@dataclass(frozen=True)
class Row:
    field: Field
    value: str | None  # None: an env[] variable set by a valueFrom
    valid: bool
    says: str = ""  # a part of the agent's reason, for an invalid row
    cap: str | None = None  # the key in CAPS of the row's namespace's max_quota; None: no max_quota
    api_server_refuses: bool = False
    why: str = ""  # the row's id
    partner: str | None = None  # the other half of the field's pair, where the pod sets it (None: a valueFrom there)
    with_partner: bool = False  # whether the pod sets the other half

    @property
    def door_admits(self) -> bool:
        """Whether the admission policy admits the pod though the agent reports the row: a variable set by a
        valueFrom is no value to refuse (the agent reads no ConfigMap or Secret, and says so), as an envFrom is not."""
        return self.value is None or (self.with_partner and self.partner is None)

    @property
    def id(self) -> str:
        where = f"-cap-{self.cap}" if self.cap else ""
        return f"{self.field.short}{where}-{self.why}"

    def pod(self, name: str = "p", namespace: str = "default") -> dict[str, Any]:
        """The row's Pod manifest."""
        if not self.with_partner:
            return self.field.pod(self.value, name, namespace)
        pod = self.field.pod(self.value, name, namespace, partner=self.partner or "")
        if self.partner is None:  # the other half from a valueFrom
            env = pod["spec"]["containers"][0]["env"]
            env[:] = [_env_entry(e["name"], None) if e["name"] != self.field.name else e for e in env]
        return pod


BELOW = "must be at least 1Mi"
OVERFLOW = "int64 maximum"
OVER = "is over the namespace max_quota"
NEGATIVE = "must not be negative"
NOT_A_NUMBER = "expected a number"
WHOLE = "must be a whole number"
BYTES_IN_A_COUNT = "not a byte quantity"
CASE = "suffixes are case-sensitive"
NOT_A_SUFFIX = "is not a Kubernetes suffix"
UNKNOWN = "unknown suffix"
SPACE = "contains whitespace"
EMPTY = "empty"
LONG = "longer than 64 characters"
MILLI = "m means milli"

# Values that are not Kubernetes quantities, free text to the agent in an annotation. In resources.limits the API
# server refuses most of them itself (400: the pod does not decode), stores "." and "+" as 0, and trims the spaces
# around a value (" 12Gi" is stored as 12Gi): those are annotation rows only. (value, reason, in limits, id)
REFUSED, ZERO, ANNOTATION_ONLY = "refused", "stored as 0", "annotation only"
NOT_QUANTITIES = [
    (
        "12GB",
        "GB is not a Kubernetes suffix; write 12Gi or 12884901888 for 12 GiB, or 12G for 12e9 bytes",
        REFUSED,
        "GB",
    ),
    ("12Mb", NOT_A_SUFFIX, REFUSED, "Mb"),
    ("1.5GB", "write 1.5Gi for 1.5 GiB", REFUSED, "fraction-GB-names-no-bytes"),
    ("12gi", "write 12Gi or 12884901888", REFUSED, "lower-case-gi"),
    ("12g", "write 12G (10^9) or 12Gi (2^30)", REFUSED, "lower-case-g"),
    ("12K", "write 12k (10^3) or 12Ki (2^10)", REFUSED, "upper-case-K"),
    ("12KiB", "KiB is not a Kubernetes suffix; write 12Ki or 12288", REFUSED, "KiB"),
    ("9EB", "write 9Ei for 9 EiB", REFUSED, "EB-bytes-past-int64-unnamed"),
    ("12x", UNKNOWN, REFUSED, "unknown-suffix"),
    ("12e", "an exponent needs digits, e.g. 12e9", REFUSED, "exponent-without-digits"),
    ("12E+", "an exponent needs digits", REFUSED, "exponent-sign-without-digits"),
    ("", EMPTY, REFUSED, "empty"),
    (" 12Gi", 'contains whitespace; write "12Gi"', ANNOTATION_ONLY, "leading-space"),
    ("12 Gi", SPACE, REFUSED, "inner-space"),
    ("12Gi\n", SPACE, ANNOTATION_ONLY, "trailing-newline"),
    ("\u00a012Gi", SPACE, ANNOTATION_ONLY, "no-break-space"),
    ("12\u2003Gi", SPACE, REFUSED, "em-space"),
    ("abc", NOT_A_NUMBER, REFUSED, "letters"),
    (".", NOT_A_NUMBER, ZERO, "a-dot"),
    ("+", NOT_A_NUMBER, ZERO, "a-sign"),
    ("1.2.3", UNKNOWN, REFUSED, "two-dots"),
    ("0x10", UNKNOWN, REFUSED, "hex"),
    ("\uff11\uff12Gi", NOT_A_NUMBER, REFUSED, "full-width-digits"),
    ('"12Gi"', NOT_A_NUMBER, REFUSED, "quoted"),
    ("12\\Gi", UNKNOWN, REFUSED, "backslash"),
    ("12\x01Gi", UNKNOWN, REFUSED, "control-character"),
    ("\x1b[31m12Gi", NOT_A_NUMBER, REFUSED, "escape-sequence"),
    ("1" * 65, LONG, ANNOTATION_ONLY, "65-characters"),
    ('"' * 70, LONG, ANNOTATION_ONLY, "70-quotes-escaped-past-80"),
    ("9" * 2000, LONG, ANNOTATION_ONLY, "2000-characters-the-agent-holds-1024"),
]

# Byte quantities: vramguard.io/vram, vramguard.io/vram-limit, vramguard.io/vram-burst.
# (value, valid, says, api_server_refuses in resources.limits, id)
BYTES = [
    ("1Mi", True, "", False, "1Mi"),
    ("12Gi", True, "", False, "12Gi"),
    ("1048576", True, "", False, "1Mi-in-bytes"),
    ("12e9", True, "", False, "exponent"),
    ("1.5e9", True, "", False, "exponent-with-a-fraction"),
    ("12G", True, "", False, "decimal-suffix"),
    ("1.5Gi", True, "", False, "fraction-of-Gi"),
    (".5Gi", True, "", False, "fraction-without-whole"),
    ("+2Gi", True, "", False, "plus-sign"),
    ("1E", True, "", False, "one-exabyte"),
    ("9223372036854775807", True, "", False, "int64-maximum"),
    ("1048575.5", True, "", True, "fraction-of-a-byte-rounds-up-to-1Mi"),
    ("0", False, "not 0 bytes", False, "zero"),
    ("-0", False, "not 0 bytes", False, "minus-zero"),
    ("100", False, "not 100 bytes", False, "100-bytes"),
    ("0.5", False, "not 1 bytes", True, "half-a-byte"),
    ("1023Ki", False, "not 1047552 bytes", False, "1023Ki"),
    ("1048575", False, BELOW, False, "one-byte-below-1Mi"),
    ("0.5Mi", False, "not 524288 bytes", False, "half-a-Mi"),
    ("1.5Ki", False, "not 1536 bytes", False, "fraction-of-Ki"),
    ("0.0000001Gi", False, "not 108 bytes", True, "tiny-fraction-of-Gi"),
    ("1e-300", False, "not 1 bytes", True, "tiny-exponent"),
    ("12e-3", False, BELOW, True, "negative-exponent"),
    ("1.", False, "not 1 bytes", False, "a-trailing-dot"),
    ("12m", False, "m means milli (10^-3) bytes; write 12M (10^6) or 12Mi (2^20)", True, "milli"),
    ("12u", False, "micro", True, "micro"),
    ("-1", False, NEGATIVE, True, "negative"),
    ("-1Gi", False, NEGATIVE, True, "negative-Gi"),
    ("9223372036854775808", False, OVERFLOW, False, "int64-maximum-plus-one"),
    ("99999999999999999999", False, OVERFLOW, True, "twenty-nines"),
    ("1e19", False, OVERFLOW, False, "1e19"),
    ("1e129", False, OVERFLOW, False, "exponent-129"),
    ("1e999999999999999999999", False, OVERFLOW, True, "exponent-beyond-int64"),
]
# An annotation is free text: what the API server stores of it is what was written.
BYTES_ANNOTATION_ONLY = [
    ("8Ei", False, OVERFLOW, "8Ei"),  # in resources.limits the API server stores it capped, as 2^63-1
    ("9223372036854775807.5", False, OVERFLOW, "int64-maximum-and-a-half"),
    ("7.99999999999999999999999999Ei", False, OVERFLOW, "just-under-8Ei-rounds-up-past-int64"),
    ("7.9999999999999999Ei", True, "", "just-under-8Ei-within-int64"),
    ("1048575.000000000000000000000000000001", True, "", "a-long-fraction-rounds-up-to-1Mi"),
    ("0.000000000000000000000000000001Ei", False, "not 1 bytes", "a-long-fraction-of-Ei"),
]

# Counts of a unit: aliyun.com/gpu-mem (GiB), nvidia.com/gpumem (MiB), tencent.com/vcuda-memory (256 MiB),
# gpu-memory (MiB). (value, valid, says, api_server_refuses in resources.limits, id)
COUNTS = [
    ("1", True, "", False, "one-unit"),
    ("16", True, "", False, "16-units"),
    ("12e3", True, "", False, "exponent"),
    ("1k", True, "", False, "decimal-suffix"),
    ("+3", True, "", False, "plus-sign"),
    ("12.0", True, "", False, "a-zero-fraction"),
    ("0", False, "not 0 bytes", False, "zero"),
    ("-0", False, "not 0 bytes", False, "minus-zero"),
    ("1.5", False, WHOLE, True, "fraction"),
    ("0.5", False, WHOLE, True, "half"),
    ("1e-300", False, WHOLE, True, "tiny-exponent"),
    ("2Gi", False, BYTES_IN_A_COUNT, False, "binary-suffix-bytes"),
    ("3Ki", False, BYTES_IN_A_COUNT, False, "binary-suffix-not-whole-units"),
    ("0Gi", False, "not a byte quantity; write 0 for 0Gi", False, "zero-Gi"),
    ("-1", False, NEGATIVE, True, "negative"),
    ("-2Gi", False, NEGATIVE, True, "negative-Gi"),
    ("1m", False, MILLI, True, "milli"),
    ("9223372036854775807", False, OVERFLOW, False, "int64-maximum-units"),
    ("1e999", False, OVERFLOW, False, "exponent-999"),
]
COUNTS_ANNOTATION_ONLY = [
    ("1.5Gi", False, BYTES_IN_A_COUNT, "fraction-of-Gi-names-no-count"),  # as a resource, stored as 1536Mi
    ("16Ei", False, BYTES_IN_A_COUNT, "bytes-past-int64"),
]

# NVIDIA's variables: whole MiB in digits alone, as the container toolkit reads them (quantity.parse_mib_digits).
# An env value is free text to the API server. (value, valid, says, id)
DIGITS_READ = "as NVIDIA's toolkit reads it"
NO_HINT = DIGITS_READ + ")"  # nothing to write instead
VALUE_FROM = "sets it from elsewhere (valueFrom), which vramguard does not read"
ENV_DIGITS: list[tuple[str | None, bool, str, str]] = [
    ("4096", True, "", "4096-MiB"),
    ("1", True, "", "1-MiB"),
    ("0010", True, "", "leading-zeros-as-the-toolkit"),
    ("8796093022207", True, "", "int64-maximum-MiB"),
    ("0", False, "not 0 bytes", "zero"),
    ("000", False, "not 0 bytes", "zeros"),
    ("8796093022208", False, OVERFLOW, "int64-maximum-plus-one-MiB"),
    ("99999999999999999999", False, OVERFLOW, "twenty-nines"),
    ("1" * 64, False, OVERFLOW, "64-digits"),
    ("1" * 65, False, LONG, "65-digits"),
    ("9" * 2000, False, LONG, "2000-digits-the-agent-holds-1024"),
    ("2048MiB", False, "digits alone, as NVIDIA's toolkit reads it; write 2048 for 2048MiB)", "MiB-written-out"),
    ("2048 MiB", False, "; write 2048 for 2048 MiB)", "MiB-written-out-with-a-space"),
    ("0010MiB", False, "; write 10 for 0010MiB)", "MiB-written-out-with-leading-zeros"),
    ("9999999999999999999MiB", False, "; write 9999999999999999999 for 9999999999999999999MiB)", "MiB-19-digits"),
    ("99999999999999999999MiB", False, NO_HINT, "MiB-20-digits-no-hint"),
    ("4Gi", False, "; write 4096 for 4Gi)", "Gi-quantity"),
    ("4096Mi", False, "; write 4096 for 4096Mi)", "Mi-quantity"),
    ("1.5Gi", False, "; write 1536 for 1.5Gi)", "fraction-of-Gi"),
    ("4.5Pi", False, "; write 4831838208 for 4.5Pi)", "fraction-of-Pi-past-2-to-the-52"),
    ("+4Gi", False, "; write 4096 for +4Gi)", "plus-sign-quantity"),
    ("4G", False, NO_HINT, "decimal-G-is-no-whole-MiB"),
    ("1Ki", False, NO_HINT, "Ki-below-a-MiB"),
    ("+4096", False, NO_HINT, "plus-sign"),
    ("-1", False, NO_HINT, "negative"),
    ("1e3", False, NO_HINT, "exponent"),
    ("0x400", False, NO_HINT, "hex"),
    ("1_024", False, NO_HINT, "underscore"),
    ("12GB", False, NO_HINT, "GB"),
    (" 4096", False, NO_HINT, "leading-space"),
    ("4096\n", False, NO_HINT, "trailing-newline"),
    ("\uff14\uff10\uff19\uff16", False, NO_HINT, "full-width-digits"),
    ("", False, NO_HINT, "empty"),
    (None, False, VALUE_FROM, "value-from"),
]

# A pair's halves together: (field the agent names, value, the other half's value (None: a valueFrom), valid, says,
# cap, id). The agent reports one error of a pair at most: the request's first; the namespace's max_quota holds the
# limit (the hard one) alone.
ABOVE = "is above the limit"
PAIRS: list[tuple[str, str | None, str | None, bool, str, str | None, str]] = [
    (KAI_REQUEST, "4Gi", "8Gi", True, "", None, "request-under-its-limit"),
    (KAI_REQUEST, "8Gi", "8Gi", True, "", None, "request-at-its-limit"),
    (
        KAI_REQUEST,
        "8Gi",
        "4Gi",
        False,
        f"{ABOVE} 4Gi (metadata.annotations[{KAI_LIMIT}]): a request must be at most its limit",
        None,
        "request-above-its-limit",
    ),
    (KAI_REQUEST, "8589934593", "8Gi", False, ABOVE, None, "request-a-byte-above-its-limit"),
    (KAI_REQUEST, "12GB", "4Gi", False, NOT_A_SUFFIX, None, "bad-request-with-a-limit"),
    (KAI_LIMIT, "12GB", "4Gi", False, NOT_A_SUFFIX, None, "bad-limit-with-a-request"),
    (KAI_REQUEST, "abc", "12GB", False, NOT_A_NUMBER, None, "both-bad-the-request-named"),
    (KAI_LIMIT, "8Gi", "4Gi", True, "", "16Gi", "pair-under-the-cap"),
    (KAI_LIMIT, "32Gi", "8Gi", False, f"{OVER} 16Gi", "16Gi", "limit-over-the-cap"),
    (KAI_LIMIT, "64Gi", "32Gi", False, f"{OVER} 16Gi", "16Gi", "both-over-the-cap-the-limit-named"),
    (KAI_REQUEST, "32Gi", "20Gi", False, f"{ABOVE} 20Gi", "16Gi", "request-above-its-limit-over-the-cap"),
    (ENV_REQUEST, "2048", "4096", True, "", None, "request-under-its-limit"),
    (
        ENV_REQUEST,
        "8192",
        "4096",
        False,
        f"{ABOVE} 4096 (spec.containers[main].env[{ENV_LIMIT}]): a request must be at most its limit",
        None,
        "request-above-its-limit",
    ),
    (ENV_REQUEST, "0010", "9", False, ABOVE + " 9 (", None, "request-above-its-limit-leading-zeros"),
    (ENV_REQUEST, "2048MiB", "4096", False, "write 2048 for 2048MiB", None, "bad-request-with-a-limit"),
    (ENV_LIMIT, "4Gi", "2048", False, "write 4096 for 4Gi", None, "bad-limit-with-a-request"),
    (ENV_REQUEST, None, "4096", False, VALUE_FROM, None, "request-from-a-value-from"),
    (ENV_LIMIT, None, "2048", False, VALUE_FROM, None, "limit-from-a-value-from"),
    (ENV_LIMIT, "32768", "2048", False, f"{OVER} 16Gi", "16Gi", "limit-over-the-cap"),
    (ENV_REQUEST, "32768", "16384", False, ABOVE, "16Gi", "request-above-its-limit-over-the-cap"),
]

# Each field against a max_quota of 16Gi (or the same bytes written otherwise): (field, value, valid, id).
UNDER_AND_OVER_16GI = [
    (VRAM, "16Gi", True, "at-the-cap"),
    (VRAM, "17179869185", False, "one-byte-over"),
    (VRAM, "32Gi", False, "over"),
    (VRAM, "1.5e10", True, "exponent-under"),
    (ALIYUN, "16", True, "at-the-cap"),
    (ALIYUN, "17", False, "over"),
    (HAMI, "16384", True, "at-the-cap"),
    (HAMI, "16385", False, "over"),
    (TENCENT, "64", True, "at-the-cap"),
    (TENCENT, "65", False, "over"),
    (LIMIT, "16Gi", True, "at-the-cap"),
    (LIMIT, "17179869184.5", False, "half-a-byte-over"),
    (LIMIT, "32Gi", False, "over"),
    (LIMIT, "7.9999999999999999Ei", False, "far-over"),
    (KAI, "16384", True, "at-the-cap"),
    (KAI, "16385", False, "over"),
    (BURST, "16Gi", True, "at-the-cap"),
    (BURST, "32Gi", False, "over"),
    (KAI_LIMIT, "16Gi", True, "at-the-cap"),
    (KAI_LIMIT, "17179869185", False, "one-byte-over"),
    (KAI_REQUEST, "32Gi", False, "request-alone-over"),
    (ENV_LIMIT, "16384", True, "at-the-cap"),
    (ENV_LIMIT, "16385", False, "over"),
    (ENV_REQUEST, "16385", False, "request-alone-over"),
]
# The other spellings of a max_quota: (cap, field, value, valid, id)
OTHER_CAPS = [
    ("bytes", VRAM, "16Gi", True, "at-the-cap"),
    ("bytes", VRAM, "17Gi", False, "over"),
    ("12e9", VRAM, "12G", True, "at-the-cap"),
    ("12e9", LIMIT, "12000000001", False, "one-byte-over"),
    ("1.5Gi", HAMI, "1536", True, "at-the-cap"),
    ("1.5Gi", HAMI, "1537", False, "over"),
]


def _rows() -> Iterator[Row]:
    for f in FIELDS:
        resource = f.kind == "resource"
        if f.kind == "env":
            for env_value, valid, says, why in ENV_DIGITS:
                yield Row(f, env_value, valid, says, why=why)
            continue
        for value, says, in_limits, why in NOT_QUANTITIES:
            if resource and in_limits == ANNOTATION_ONLY:
                continue
            yield Row(f, value, False, says, api_server_refuses=resource and in_limits == REFUSED, why=why)
        if f.unit_bytes == 1:
            for value, valid, says, refused, why in BYTES:
                yield Row(f, value, valid, says, api_server_refuses=resource and refused, why=why)
            if not resource:
                for value, valid, says, why in BYTES_ANNOTATION_ONLY:
                    yield Row(f, value, valid, says, why=why)
        else:
            for value, valid, says, refused, why in COUNTS:
                yield Row(f, value, valid, says, api_server_refuses=resource and refused, why=why)
            if not resource:
                for value, valid, says, why in COUNTS_ANNOTATION_ONLY:
                    yield Row(f, value, valid, says, why=why)
    for name, value, valid, why in UNDER_AND_OVER_16GI:
        yield Row(BY_NAME[name], value, valid, "" if valid else f"{OVER} 16Gi", cap="16Gi", why=why)
    for cap, name, value, valid, why in OTHER_CAPS:
        shown = {"bytes": "16Gi", "12e9": "12G", "1.5Gi": "1536Mi"}[cap]
        yield Row(BY_NAME[name], value, valid, "" if valid else f"{OVER} {shown}", cap=cap, why=why)
    for name, half, partner, valid, says, pair_cap, why in PAIRS:
        yield Row(BY_NAME[name], half, valid, says, cap=pair_cap, why=why, partner=partner, with_partner=True)


ROWS = tuple(_rows())
