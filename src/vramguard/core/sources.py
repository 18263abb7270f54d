"""Quota sources: where in a pod a quota is read (`resource:`, `annotation:`, `env:`, `claim:`), and the unit of each.

`Policy.quota_sources` lists them in order; `parse_quota_source` turns one entry into a `QuotaSource` or says what
is wrong with it. No I/O, no clock.

Two sources are pairs, a request (the soft limit) and a limit (the hard one), as NVIDIA's own tools declare them:
`env:NVIDIA_GPU_MEMORY`, the container's `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT` (whole MiB, which
the container toolkit's hook programs into the driver on R615+), and
`annotation:nvidia.com/container.<container>.gpu-memory`, KAI Scheduler's per-container annotations
`nvidia.com/container.<name>.gpu-memory.request` and `.limit` (Kubernetes quantities), from which its NRI plugin
writes those variables.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Final

from vramguard.core.quantity import (
    ANNOTATION_UNIT_BYTES,
    ENV_LIMIT_SUFFIX,
    ENV_REQUEST_SUFFIX,
    ENV_UNIT_BYTES,
    RESOURCE_UNIT_BYTES,
    parse_mib_digits,
    parse_quota_bytes,
)
from vramguard.core.text import MAX_TEXT_CHARS, cut

BURST_ANNOTATION: Final = "vramguard.io/vram-burst"


# The annotation that sets a burst is not a quota source: listing it would make a burst a quota.
QUOTA_ANNOTATION_UNIT_BYTES: Final[Mapping[str, int]] = MappingProxyType(
    {name: unit for name, unit in ANNOTATION_UNIT_BYTES.items() if name != BURST_ANNOTATION}
)


# KAI Scheduler's per-container annotations (NvFractions): `nvidia.com/container.<name>.gpu-memory.request` and
# `.limit`, each a Kubernetes quantity, for the container named. Its source names the pair with the placeholder.
CONTAINER_PLACEHOLDER: Final = "<container>"
KAI_CONTAINER_PREFIX: Final = "nvidia.com/container."
KAI_CONTAINER_SUFFIX: Final = ".gpu-memory"
KAI_CONTAINER_SOURCE: Final = f"{KAI_CONTAINER_PREFIX}{CONTAINER_PLACEHOLDER}{KAI_CONTAINER_SUFFIX}"
PAIR_SUFFIXES: Final = {"annotation": (".request", ".limit"), "env": (ENV_REQUEST_SUFFIX, ENV_LIMIT_SUFFIX)}
# The per-container annotations' source, with the unit of its values (a byte quantity).
PER_CONTAINER_ANNOTATION_UNIT_BYTES: Final[Mapping[str, int]] = MappingProxyType({KAI_CONTAINER_SOURCE: 1})

# A DRA driver's name or a DeviceClass's name: a DNS subdomain.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class SourceKind(str, enum.Enum):
    RESOURCE = "resource"  # a container's resources.limits
    ANNOTATION = "annotation"  # a pod annotation, covering the whole pod; or a pair per container (`per_container`)
    ENV = "env"  # a pair of the container's environment variables (`env[]` literal values)
    CLAIM = "claim"  # the GPU memory shares of the container's DRA claims, per GPU (`core/shares.py`)


@dataclass(frozen=True, slots=True)
class QuotaSource:
    """One entry of `Policy.quota_sources`, e.g. `resource:nvidia.com/gpumem`, with the bytes per unit."""

    kind: SourceKind
    name: str
    unit_bytes: int

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.name}"

    @property
    def field(self) -> str:
        """The field of the pod it reads, as messages name it: `limits[<name>]`, `annotation <name>`, `env <name>`,
        `claim <name>`."""
        return f"limits[{self.name}]" if self.kind is SourceKind.RESOURCE else f"{self.kind.value} {self.name}"

    @property
    def per_container(self) -> bool:
        """Whether it gives each container its own quota: a resource, a pair of variables, a per-container
        annotation, a claim. The others are pod-wide annotations."""
        return self.kind is not SourceKind.ANNOTATION or CONTAINER_PLACEHOLDER in self.name

    @property
    def pair(self) -> bool:
        """Whether it reads a request (the soft limit) and a limit (the hard one) rather than one value."""
        return self.kind is SourceKind.ENV or (self.kind is SourceKind.ANNOTATION and self.per_container)

    def value_bytes(self, raw: str, key: str = "") -> int:
        """`raw` in bytes, as the agent reads a value of this source (`key`: the field, a pair's request or limit;
        the source's name where not given): whole MiB in digits alone for the toolkit's variables, else a Kubernetes
        quantity, or a count of `unit_bytes`; at least 1Mi. QuantityError, naming the value, where it refuses it."""
        name = key or self.name
        if self.kind is SourceKind.ENV:
            return parse_mib_digits(raw, name)
        return parse_quota_bytes(raw, self.unit_bytes, name)

    def pair_keys(self, container: str) -> tuple[str, str]:
        """The request's and the limit's names for `container`: the variables, or the container's annotations."""
        request, limit = PAIR_SUFFIXES[self.kind.value]
        name = self.name.replace(CONTAINER_PLACEHOLDER, container)
        return name + request, name + limit


@dataclass(frozen=True, slots=True)
class QuotaError:
    """A quota value the agent could not use. Becomes a VRAMQuotaInvalid Warning Event on the pod.

    `quota.invalid_message` turns one into the Event's text. Every field is stored cut to MAX_CHARS (with a
    marker saying how long it was): a tenant can write a 10 MB annotation, and whoever logs an error must never
    log megabytes.
    """

    MAX_CHARS: ClassVar[int] = MAX_TEXT_CHARS

    field: str  # e.g. "spec.containers[trainer].resources.limits[vramguard.io/vram]"
    value: str  # as written, cut to MAX_CHARS
    message: str  # reads after the value: "is not a valid quantity (GB is not a Kubernetes suffix; ...)"
    # What applies instead, filled in once the pod's quotas are resolved: "limits[nvidia.com/gpumem] 2Gi",
    # "default fixed 4Gi", "namespace max_quota 8Gi (no valid quota)", "no quota: unmanaged".
    applies: str = ""

    def __post_init__(self) -> None:
        for name in ("field", "value", "message", "applies"):
            text = getattr(self, name)
            if isinstance(text, str) and len(text) > self.MAX_CHARS:
                object.__setattr__(self, name, cut(text, self.MAX_CHARS))


def parse_quota_source(text: str) -> QuotaSource:
    """`resource:vramguard.io/vram`, `annotation:gpu-memory`, `env:NVIDIA_GPU_MEMORY` or `claim:gpu.nvidia.com` →
    QuotaSource; ValueError says what is wrong."""
    kind_text, sep, name = text.partition(":")
    known_by_kind = {
        SourceKind.RESOURCE: RESOURCE_UNIT_BYTES,
        SourceKind.ANNOTATION: {**QUOTA_ANNOTATION_UNIT_BYTES, **PER_CONTAINER_ANNOTATION_UNIT_BYTES},
        SourceKind.ENV: ENV_UNIT_BYTES,
    }
    kind = next((k for k in SourceKind if k.value == kind_text), None)
    if not sep or kind is None:
        raise ValueError("must be resource:<name>, annotation:<name>, env:<name> or claim:<DRA driver or device class>")
    if kind is SourceKind.CLAIM:
        if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
            raise ValueError(f"{name[:80]!r} is not a DRA driver or device class name (a DNS subdomain)")
        return QuotaSource(kind, name, 1)
    known = known_by_kind[kind]
    if name not in known:
        raise ValueError(f"vramguard knows the unit of no {kind.value} named {name!r}; known: {', '.join(known)}")
    return QuotaSource(kind, name, known[name])


def reads_claims(quota_sources: Sequence[str]) -> bool:
    """Whether any of the sources is a `claim:` source: the agent then needs a claim source (`core/shares.py`)."""
    return any(s.kind is SourceKind.CLAIM for s in readable_sources(quota_sources))


def readable_sources(texts: Sequence[str]) -> tuple[QuotaSource, ...]:
    readable = []
    for text in texts:
        try:
            readable.append(parse_quota_source(text))
        except ValueError:
            continue  # the policy loader reports these; a Policy built in code just goes without
    return tuple(readable)
