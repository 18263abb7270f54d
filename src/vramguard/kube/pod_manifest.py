"""The one translation from a Kubernetes Pod object (a plain dict, camelCase keys) to `PodInfo`: the pod watch
and the pods file both use it. It keeps only what the agent reads, bounded: the quota annotations and limits
vramguard knows (`vramguard.core.quantity`), at most `MAX_CLAIMS` claims, every string cut to `MAX_VALUE_CHARS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vramguard.core.model import ClaimUse, ContainerInfo, PodInfo
from vramguard.core.quantity import ANNOTATION_UNIT_BYTES, RESOURCE_UNIT_BYTES
from vramguard.core.text import MAX_TEXT_CHARS, cut

MAX_VALUE_CHARS: Final = MAX_TEXT_CHARS
# The API server allows 32 resourceClaims per pod; a pods file is not validated, so the same bound applies here.
MAX_CLAIMS: Final = 32


class PodSourceError(Exception):
    """A Pod object, or a pods file, the agent cannot use: the message names the pod, or the line."""


def _strip_scheme(container_id: object) -> str | None:
    """`containerd://abc…` → `abc…`, as the cgroup path names it."""
    if not container_id:
        return None
    return cut(str(container_id).split("://", 1)[-1])


def _kept(values: Mapping[Any, Any], names: Mapping[str, int]) -> dict[str, str]:
    """The entries of `values` named in `names`, cut: the only ones the agent reads."""
    return {name: cut(str(values[name])) for name in names if name in values}


def pod_info_from_manifest(obj: Mapping[str, Any]) -> PodInfo:
    """Convert one Pod object (camelCase keys, as the API server serialises it) into a PodInfo.

    Keeps only the annotations and limits vramguard reads (`ANNOTATION_UNIT_BYTES`, `RESOURCE_UNIT_BYTES`), and
    cuts every string to `MAX_VALUE_CHARS`."""
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
    return PodInfo(
        uid=cut(str(uid)),
        namespace=cut(str(meta.get("namespace", "default"))),
        name=cut(str(meta.get("name", ""))),
        containers=containers,
        annotations=_kept(meta.get("annotations") or {}, ANNOTATION_UNIT_BYTES),
        priority=int(spec.get("priority") or 0),
        qos=cut(str(status.get("qosClass") or "BestEffort")),
        owner=owner,
        terminating=meta.get("deletionTimestamp") is not None,
        claims=_pod_claims(spec.get("resourceClaims"), status.get("resourceClaimStatuses")),
    )


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
