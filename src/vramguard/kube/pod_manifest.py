"""The one translation from a Kubernetes Pod object (a plain dict, camelCase keys) to `PodInfo`: the pod watch
and the pods file both use it. It keeps only what the agent reads, bounded: the quota annotations and limits
vramguard knows (`vramguard.core.quantity`), at most `MAX_CLAIMS` claims, every string cut to `MAX_VALUE_CHARS`.

A static pod's mirror pod becomes the PodInfo of the static pod, under the UID the kubelet runs it under (its
`MIRROR_ANNOTATION`); `index_pods` decides which of those claims the agent believes (docs/architecture.md "Static
pods").
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from vramguard.core.pod import ClaimUse, ContainerInfo, PodInfo
from vramguard.core.ports import KubeletPods
from vramguard.core.process import KubeletPod
from vramguard.core.quantity import (
    ANNOTATION_UNIT_BYTES,
    ENV_LIMIT_SUFFIX,
    ENV_REQUEST_SUFFIX,
    ENV_UNIT_BYTES,
    RESOURCE_UNIT_BYTES,
)
from vramguard.core.sources import PER_CONTAINER_ANNOTATION_UNIT_BYTES, parse_quota_source
from vramguard.core.text import MAX_TEXT_CHARS, cut

MAX_VALUE_CHARS: Final = MAX_TEXT_CHARS
# The API server allows 32 resourceClaims per pod; a pods file is not validated, so the same bound applies here.
MAX_CLAIMS: Final = 32
# On a static pod's mirror pod, the UID the kubelet runs the static pod under: its config hash, which is its UID
# (kubelet pkg/kubelet/pod/mirror_client.go, pkg/kubelet/config/common.go). The API server requires spec.nodeName
# with it and refuses to add, change or remove it after creation, but anyone who may create a pod may write it:
# `index_pods` believes it only where the node backs it.
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
# The forms a pod cgroup names its pod by (`node/cgroup.py`): the kubelet's 32-hex hash of a manifest, or a UUID (a
# manifest may set its own metadata.uid). A value of another form names no cgroup the agent reads: ignored.
_MIRROR_UID: Final = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")
_MIRROR_UID_CHARS: Final = 36
# A claim refused for want of the node's word: the kubelet may have set the pod up since its pods were last read.
UNBACKED: Final = "this node's kubelet runs no pod of that UID"
_KUBELET_HASH: Final = re.compile(r"[0-9a-f]{32}")  # what the kubelet makes a static pod's UID of, no API server


class PodSourceError(Exception):
    """A Pod object, or a pods file, the agent cannot use: the message names the pod, or the line."""


# The pod's controller as metric labels, named as kube-state-metrics' kube_pod_owner names them: the agents' usage and
# peak gauges carry them, and `kubectl vramguard recommend` places a pod in its workload by them.
OWNER_LABELS: Final = ("owner_kind", "owner_name")
NO_OWNER: Final = "<none>"  # kube_pod_owner's value for a pod without a controller


def owner_labels(pod: PodInfo) -> tuple[str, str]:
    """(owner_kind, owner_name) of the pod's controller as `pod_info_from_manifest` keeps it ("ReplicaSet/web-7d9f"),
    or kube_pod_owner's "<none>" for both where it has none."""
    if not pod.owner:
        return NO_OWNER, NO_OWNER
    kind, _, name = pod.owner.partition("/")
    return kind, name


def _strip_scheme(container_id: object) -> str | None:
    """`containerd://abc…` → `abc…`, as the cgroup path names it."""
    if not container_id:
        return None
    return cut(str(container_id).split("://", 1)[-1])


def _kept(values: Mapping[Any, Any], names: Mapping[str, int]) -> dict[str, str]:
    """The entries of `values` named in `names`, cut: the only ones the agent reads."""
    return {name: cut(str(values[name])) for name in names if name in values}


# The variables a quota is read from: NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT.
_QUOTA_ENV: Final = tuple(name + suffix for name in ENV_UNIT_BYTES for suffix in (ENV_REQUEST_SUFFIX, ENV_LIMIT_SUFFIX))


def _quota_env(env: object) -> dict[str, str | None]:
    """The quota variables of a container's `env[]`: each name's first entry, as NVIDIA's toolkit takes the first
    (the kubelet's last wins only for names it sees twice, which the API server warns of): its literal value, cut, or
    None where a `valueFrom` sets it. Every other variable is left unread."""
    found: dict[str, str | None] = {}
    for entry in env if isinstance(env, list) else ():
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if name in _QUOTA_ENV and name not in found:
            value = entry.get("value")
            found[name] = None if entry.get("valueFrom") is not None else cut(str(value if value is not None else ""))
    return found


def _has_nvidia_gpu(limits: object) -> bool:
    """Whether a container's limits give it NVIDIA GPUs (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, a MIG profile's
    `nvidia.com/mig-…`): the containers NVIDIA's toolkit applies its memory variables to."""
    return isinstance(limits, Mapping) and any(
        isinstance(k, str) and (k.startswith("nvidia.com/gpu") or k.startswith("nvidia.com/mig-")) for k in limits
    )


# KAI's per-container annotation pair, parsed once here rather than for each pod converted.
_PER_CONTAINER_PAIRS: Final = tuple(parse_quota_source(f"annotation:{s}") for s in PER_CONTAINER_ANNOTATION_UNIT_BYTES)


def _quota_annotations(annotations: object, containers: Iterable[str]) -> dict[str, str]:
    """The annotations a quota is read from, cut: the pod-wide ones vramguard knows (`ANNOTATION_UNIT_BYTES`) and,
    for each of the pod's containers, KAI's `nvidia.com/container.<name>.gpu-memory.request` and `.limit`. Looked up
    by name, so a pod's thousands of other annotations cost nothing."""
    if not isinstance(annotations, Mapping):
        return {}
    kept = _kept(annotations, ANNOTATION_UNIT_BYTES)
    for pair in _PER_CONTAINER_PAIRS:
        for container in containers:
            for key in pair.pair_keys(container):
                if key in annotations:
                    kept[key] = cut(str(annotations[key]))
    return kept


def pod_info_from_manifest(obj: Mapping[str, Any]) -> PodInfo:
    """Convert one Pod object (camelCase keys, as the API server serialises it) into a PodInfo.

    Keeps only the annotations, limits and variables vramguard reads (`ANNOTATION_UNIT_BYTES` and KAI's per-container
    annotations, `RESOURCE_UNIT_BYTES`, `ENV_UNIT_BYTES`), and cuts every string to `MAX_VALUE_CHARS`. A mirror pod
    (`MIRROR_ANNOTATION` naming a UID of a pod cgroup's form) becomes its static pod: `uid` the UID claimed,
    `mirror_uid` its own; whether the claim is believed is `index_pods`' to say."""
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
            env=_quota_env(c.get("env")),
            env_from=bool(c.get("envFrom")) and _has_nvidia_gpu((c.get("resources") or {}).get("limits")),
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
    uid = cut(str(uid))
    runs_as = _mirror_of(meta.get("annotations")) or uid  # a static pod's mirror: the UID the kubelet runs it as
    return PodInfo(
        uid=runs_as,
        mirror_uid=uid if runs_as != uid else None,
        namespace=cut(str(meta.get("namespace", "default"))),
        name=cut(str(meta.get("name", ""))),
        containers=containers,
        annotations=_quota_annotations(meta.get("annotations"), [c.name for c in containers]),
        priority=int(spec.get("priority") or 0),
        qos=cut(str(status.get("qosClass") or "BestEffort")),
        owner=owner,
        terminating=meta.get("deletionTimestamp") is not None,
        claims=_pod_claims(spec.get("resourceClaims"), status.get("resourceClaimStatuses")),
    )


def _mirror_of(annotations: object) -> str | None:
    """The UID a mirror pod's annotation names, when it has a pod UID's form; else None (no claim, or ignored)."""
    value = annotations.get(MIRROR_ANNOTATION) if isinstance(annotations, Mapping) else None
    if isinstance(value, str) and len(value) <= _MIRROR_UID_CHARS and _MIRROR_UID.fullmatch(value):
        return value
    return None


@dataclass(frozen=True, slots=True)
class PodIndex:
    """Pods by the UID the kubelet runs each under (`PodInfo.uid`, the `PodSource.pods()` mapping), and the mirror
    claims not believed: the claiming pod's own metadata.uid → why."""

    pods: Mapping[str, PodInfo]
    refused: Mapping[str, str]


def index_pods(
    pods: Iterable[PodInfo], *, kubelet: KubeletPods | None = None, api_uids: Container[str] = frozenset()
) -> PodIndex:
    """Index `pods` (each API object once) by the UID the kubelet runs each under.

    A mirror pod's annotation is tenant input: anyone who may create a pod bound to the node may write one, naming
    any UID. So a claim is believed only where the node itself says it is the static pod's mirror: `kubelet` runs
    that UID as exactly the claimant's namespace and name (the kubelet gives a mirror pod its static pod's, and the
    API server lets one pod have a namespace and name). A claim on a UID the API server gave a pod (one in `pods`,
    or in `api_uids`) names no static pod and is refused outright; a claim the kubelet does not back is refused
    until it does (a mirror the kubelet made before the pod's sandbox: it is asked again at the next version).
    A refused claim changes nothing: it voids no genuine claim and shields no pod's processes.
    """
    by_uid: dict[str, PodInfo] = {}
    claims: list[PodInfo] = []
    for pod in pods:
        if pod.static:
            claims.append(pod)
        else:
            by_uid[pod.uid] = pod
    refused: dict[str, str] = {}
    for pod in claims:
        why = _refusal(pod, by_uid, kubelet, api_uids)
        if why is None and pod.uid not in by_uid:
            by_uid[pod.uid] = pod
        else:
            why = why or "another pod's claim on it is believed"
            refused[pod.object_uid] = f"pod {pod.key} claims to be the mirror of UID {pod.uid}: {why}"
    for uid, runs in (kubelet.pods() if kubelet is not None else {}).items():
        if uid not in by_uid and _KUBELET_HASH.fullmatch(uid):
            by_uid[uid] = mirrorless_static_pod(uid, runs)
    return PodIndex(by_uid, refused)


def mirrorless_static_pod(uid: str, runs: KubeletPod) -> PodInfo:
    """A static pod the kubelet runs under its hash of the manifest (which no API server gives) with no believed
    mirror: governed under its namespace (the policy's default quota and the namespace's cap, pod-wide: its
    containers are unknown). A UID of a UUID's form is not taken so: it may be an API server pod the watch has not
    delivered yet, whose own quota is not known."""
    return PodInfo(uid=uid, namespace=runs.namespace, name=runs.name, mirrorless=True)


def _refusal(
    pod: PodInfo, by_uid: Mapping[str, PodInfo], kubelet: KubeletPods | None, api_uids: Container[str]
) -> str | None:
    """Why `pod`'s mirror claim is not believed; None when the node backs it."""
    owner = by_uid.get(pod.uid)
    if owner is not None and not owner.static:
        return f"the API server gave that UID to pod {owner.key}"
    if pod.uid in api_uids:
        return "the API server gave that UID to a pod of this node"
    runs = kubelet.runs(pod.uid) if kubelet is not None else None
    if runs is None:
        return UNBACKED
    if (runs.namespace, runs.name) != (pod.namespace, pod.name):
        return f"this node's kubelet runs that UID as {runs.key}"
    return None


def log_refused(
    log: structlog.typing.FilteringBoundLogger, refused: Mapping[str, str], before: Mapping[str, str]
) -> None:
    """Log each refused mirror claim of `refused` once: those not in `before` (the last version served)."""
    for uid, why in refused.items():
        if before.get(uid) != why:
            log.warning("pod_mirror_claim_refused", pod_uid=uid, why=why)


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
