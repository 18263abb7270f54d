"""What the API server (or the node itself, for a static pod) tells the agent about a pod: the fields quotas,
attribution, Events and kills read. The kube adapter converts a V1Pod into a `PodInfo` at the edge; no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


def _frozen_map(m: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(m or {}))


@dataclass(frozen=True, slots=True)
class ClaimUse:
    """A container's `resources.claims[]` entry: the pod's claim it uses, and which of its requests ("" for all)."""

    name: str  # an entry of the pod's spec.resourceClaims[].name
    request: str = ""


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    name: str
    container_id: str | None = None  # runtime ID without the "containerd://" scheme
    # Raw resources.limits, e.g. {"vramguard.io/vram": "12Gi"}.
    limits: Mapping[str, str] = field(default_factory=_frozen_map)
    claims: tuple[ClaimUse, ...] = ()  # the DRA claims the container uses (resources.claims)
    # The environment variables a quota is read from (`quantity.ENV_UNIT_BYTES`), as its `env[]` sets them: the
    # literal value, or None where a `valueFrom` sets it (a ConfigMap's, a Secret's, a field's: not read).
    env: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))
    # It has NVIDIA GPUs (a `nvidia.com/` GPU or MIG resource) and an `envFrom`, which may set the toolkit's variables
    # where vramguard does not read them (a ConfigMap, a Secret).
    env_from: bool = False


@dataclass(frozen=True, slots=True)
class PodInfo:
    # The UID the kubelet runs the pod under, which names its cgroup: attribution, quotas, limits and kills go by
    # it. A pod's metadata.uid; for a static pod, the UID its mirror pod names (`kube/pod_manifest.py`).
    uid: str
    namespace: str
    name: str
    containers: tuple[ContainerInfo, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=_frozen_map)
    priority: int = 0
    qos: str = "BestEffort"
    owner: str | None = None  # "ReplicaSet/web-7d9f" etc.
    terminating: bool = False  # metadata.deletionTimestamp is set
    # The pod's DRA claims: spec.resourceClaims[].name → the ResourceClaim object's name (resourceClaimName, or
    # for a template the name status.resourceClaimStatuses gives it; None until the claim controller made it).
    claims: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))
    # A static pod's: its mirror pod's own metadata.uid, which differs from `uid`. None for any other pod.
    mirror_uid: str | None = None
    # A static pod the API server holds no believed mirror of, known from the node alone (`ports.KubeletPods`): its
    # namespace and name are the kubelet's, its containers unknown (its quota is pod-wide: `core/quota.py`).
    mirrorless: bool = False
    # Derived index: attribution looks containers up by runtime ID once per GPU process per scan.
    _by_id: Mapping[str, ContainerInfo] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {c.container_id: c for c in self.containers if c.container_id})

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def static(self) -> bool:
        """Run by the kubelet from a manifest on the node; the API server holds only its mirror pod, if that."""
        return self.mirror_uid is not None or self.mirrorless

    @property
    def object_uid(self) -> str:
        """The API object's metadata.uid (an eviction's precondition; the pod cache's key): the mirror pod's, for a
        static pod. Its Events name `uid`, as the kubelet's do, which is what `kubectl describe` looks for."""
        return self.mirror_uid if self.mirror_uid is not None else self.uid

    def container_by_id(self, container_id: str) -> ContainerInfo | None:
        return self._by_id.get(container_id)


@dataclass(frozen=True, slots=True)
class NodeRef:
    """The agent's Node as the object of an Event (a GPU fault belongs to no pod): written in "default" with the
    node's name as its UID, as the kubelet writes its own Node Events. Shaped like `PodInfo` where the Event path
    reads it (`uid`, `namespace`, `name`, `key`)."""

    name: str
    namespace: str = "default"

    @property
    def uid(self) -> str:
        return self.name

    @property
    def key(self) -> str:
        return f"node/{self.name}"


EventSubject = PodInfo | NodeRef  # what an Event is about
