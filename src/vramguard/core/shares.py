"""DRA claims as quotas: the GPU memory share each container of a pod holds on each GPU. Pure.

How a claim's allocation maps to a GPU, a share and the containers holding it: `docs/architecture.md` "DRA claims as
quotas".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final

from vramguard.core.pod import ClaimUse, PodInfo
from vramguard.core.quantity import QuantityError, parse_quota_bytes
from vramguard.core.sources import QuotaError

DeviceKey = tuple[str, str, str]
"""(driver, pool, device): how a claim's allocation result names a device of a ResourceSlice."""

ClaimKey = tuple[str, str]
"""(namespace, name) of a ResourceClaim."""

# The API server's own bounds (resource.k8s.io/v1 validation): a slice lists at most 128 devices, an allocation
# at most 32 results, a claim at most 32 requests of at most 8 subrequests. A pods file is not validated, so the
# conversions below hold every list to them.
MAX_SLICE_DEVICES: Final = 128
MAX_RESULTS: Final = 32
MAX_REQUESTS: Final = 32
MAX_SUBREQUESTS: Final = 8
MAX_NAME_CHARS: Final = 253

MEMORY: Final = "memory"  # the capacity name NVIDIA's DRA driver (and this module) reads
UUID: Final = "uuid"  # the attribute that names the GPU


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """What the agent reads of one device of a ResourceSlice."""

    uuid: str | None  # the `uuid` attribute, None when it has none
    memory: str | None  # the `memory` capacity as published (a quantity), None when it has none


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One entry of a claim's status.allocation.devices.results."""

    request: str  # "gpu", or "gpu/small" for a subrequest
    driver: str
    pool: str
    device: str
    consumed_memory: str | None  # consumedCapacity.memory as written; None for a whole-device allocation
    share_id: str | None
    admin_access: bool = False  # monitoring access to a device others use: no memory of its own

    @property
    def device_key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class Claim:
    """What the agent reads of one ResourceClaim."""

    namespace: str
    name: str
    uid: str
    allocated: bool
    results: tuple[ClaimResult, ...] = ()
    # The device class of each request and subrequest ("gpu", "gpu/small"), from spec.devices.requests.
    classes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def key(self) -> ClaimKey:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Share:
    """One device result a container holds: `bytes` on GPU `gpu_uuid`, or an `error` saying why not."""

    claim: str  # "namespace/name"
    request: str
    driver: str  # "" when the claim could not be read at all
    device_class: str
    key: str  # "<claim UID>/<result index>": the same share in every container that holds it
    gpu_uuid: str = ""
    bytes: int = 0
    share_id: str | None = None
    error: QuotaError | None = None

    def matches(self, source_name: str) -> bool:
        """Whether the quota source `claim:<source_name>` reads this share. An unreadable claim matches every
        claim source: nobody can tell whose it would have been."""
        return not self.driver or source_name in (self.driver, self.device_class)

    def describe(self) -> str:
        """The quota's source as messages name it: `claim ml/train-gpu-x7k2 (request gpu, share 5f0e2a1c)`."""
        share = f", share {self.share_id[:8]}" if self.share_id else ""
        return f"claim {self.claim} (request {self.request}{share})"


PodShares = Mapping[str, tuple[Share, ...]]
"""container name → the shares (and unreadable claims) it holds."""


# --------------------------------------------------------------------------------------------------------------
# Shares


def claim_keys(pod: PodInfo) -> list[ClaimKey]:
    """The claims a pod's containers use that have a name yet: what the kube adapter reads for the pod."""
    used = {use.name for c in pod.containers for use in c.claims}
    return [(pod.namespace, claim) for ref, claim in pod.claims.items() if claim and ref in used]


def pod_shares(
    pod: PodInfo,
    claims: Mapping[ClaimKey, Claim | None],
    devices: Mapping[DeviceKey, SliceDevice],
) -> PodShares:
    """What each container of `pod` holds, from the claims read so far (None: the API server says the claim
    does not exist; absent: not read yet) and this node's ResourceSlice devices."""
    shares: dict[str, tuple[Share, ...]] = {}
    for container in pod.containers:
        held: list[Share] = []
        for use in container.claims:
            held += _held(pod, container.name, use, claims, devices)
        if held:
            shares[container.name] = tuple(held)
    return MappingProxyType(shares)


def _held(
    pod: PodInfo,
    container: str,
    use: ClaimUse,
    claims: Mapping[ClaimKey, Claim | None],
    devices: Mapping[DeviceKey, SliceDevice],
) -> list[Share]:
    at = f"spec.containers[{container}].resources.claims[{use.name}]"
    if use.name not in pod.claims:
        error = QuotaError(at, use.name, "names no entry of spec.resourceClaims")
        return [Share(claim=use.name, request=use.request, driver="", device_class="", key="", error=error)]
    claim_name = pod.claims[use.name]
    if not claim_name or (pod.namespace, claim_name) not in claims:
        return []  # the claim controller has not made it, or the agent has not read it yet
    claim = claims[(pod.namespace, claim_name)]
    if claim is None:
        error = QuotaError(f"resourceclaims[{pod.namespace}/{claim_name}]", claim_name, "does not exist")
        claim_text = f"{pod.namespace}/{claim_name}"
        return [Share(claim=claim_text, request=use.request, driver="", device_class="", key="", error=error)]
    if not claim.allocated:
        return []
    return [
        _share(claim, index, result, devices)
        for index, result in enumerate(claim.results)
        if not result.admin_access
        and (not use.request or result.request == use.request or result.request.startswith(use.request + "/"))
    ]


def _share(claim: Claim, index: int, result: ClaimResult, devices: Mapping[DeviceKey, SliceDevice]) -> Share:
    base = Share(
        claim=f"{claim.namespace}/{claim.name}",
        request=result.request,
        driver=result.driver,
        device_class=claim.classes.get(result.request, ""),
        key=f"{claim.uid}/{index}",
        share_id=result.share_id,
    )
    at = f"resourceclaims[{base.claim}].status.allocation.devices.results[{index}]"
    device = devices.get(result.device_key)
    if device is None:
        where = "/".join(result.device_key)
        return _failed(base, f"{at}.device", where, "is in no ResourceSlice of this node")
    if device.uuid is None:
        where = "/".join(result.device_key)
        return _failed(base, f"{at}.device", where, f"has no {UUID!r} attribute naming its GPU")
    if result.consumed_memory is not None:
        raw, value_field = result.consumed_memory, f"{at}.consumedCapacity[{MEMORY}]"
    elif device.memory is not None:
        raw, value_field = device.memory, f"resourceslice device {'/'.join(result.device_key)} capacity[{MEMORY}]"
    else:
        where = "/".join(result.device_key)
        return _failed(base, f"{at}.device", where, f"has no {MEMORY!r} capacity (a whole-device allocation)")
    try:
        size = parse_quota_bytes(raw, 1, MEMORY)
    except QuantityError as e:
        return _failed(base, value_field, raw, f"is not a valid {e.what} ({e.reason})")
    return replace(base, gpu_uuid=device.uuid, bytes=size)


def _failed(base: Share, at: str, value: str, message: str) -> Share:
    return replace(base, error=QuotaError(at, value, message))
