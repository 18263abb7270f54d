"""ResourceSlices and ResourceClaims (resource.k8s.io/v1, camelCase dicts as the API server serialises them) as the
decision core's `Claim` and `SliceDevice`: bounded, never raising."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from vramguard.core.shares import (
    MAX_NAME_CHARS,
    MAX_REQUESTS,
    MAX_RESULTS,
    MAX_SLICE_DEVICES,
    MAX_SUBREQUESTS,
    MEMORY,
    UUID,
    Claim,
    ClaimResult,
    DeviceKey,
    SliceDevice,
)
from vramguard.core.text import cut


def _text(value: object) -> str:
    return cut(value if isinstance(value, str) else "" if value is None else str(value), MAX_NAME_CHARS)


def _items(value: object, limit: int) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        return []
    return [v for v in value[:limit] if isinstance(v, Mapping)]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def slice_devices(obj: Mapping[str, Any]) -> dict[DeviceKey, SliceDevice]:
    """The devices one ResourceSlice publishes, by (driver, pool, device)."""
    spec = _mapping(obj.get("spec"))
    driver = _text(spec.get("driver"))
    pool = _text(_mapping(spec.get("pool")).get("name"))
    devices: dict[DeviceKey, SliceDevice] = {}
    for d in _items(spec.get("devices"), MAX_SLICE_DEVICES):
        attributes = _mapping(d.get("attributes"))
        attribute = _mapping(attributes.get(UUID) or attributes.get(f"{driver}/{UUID}"))
        uuid = attribute.get("string")
        memory = _mapping(_mapping(d.get("capacity")).get(MEMORY)).get("value")
        devices[(driver, pool, _text(d.get("name")))] = SliceDevice(
            uuid=_text(uuid) if isinstance(uuid, str) and uuid else None,
            memory=_text(memory) if memory is not None else None,
        )
    return devices


def claim_from_manifest(obj: Mapping[str, Any]) -> Claim:
    """One ResourceClaim (resource.k8s.io/v1) as the agent reads it."""
    meta = _mapping(obj.get("metadata"))
    allocation = _mapping(_mapping(obj.get("status")).get("allocation"))
    results = tuple(
        ClaimResult(
            request=_text(r.get("request")),
            driver=_text(r.get("driver")),
            pool=_text(r.get("pool")),
            device=_text(r.get("device")),
            consumed_memory=_consumed(r),
            share_id=_text(r["shareID"]) if r.get("shareID") else None,
            admin_access=r.get("adminAccess") is True,
        )
        for r in _items(_mapping(allocation.get("devices")).get("results"), MAX_RESULTS)
    )
    classes: dict[str, str] = {}
    for request in _items(_mapping(_mapping(obj.get("spec")).get("devices")).get("requests"), MAX_REQUESTS):
        name = _text(request.get("name"))
        exactly = _mapping(request.get("exactly"))
        if exactly:
            classes[name] = _text(exactly.get("deviceClassName"))
        for sub in _items(request.get("firstAvailable"), MAX_SUBREQUESTS):
            classes[f"{name}/{_text(sub.get('name'))}"] = _text(sub.get("deviceClassName"))
    return Claim(
        namespace=_text(meta.get("namespace")),
        name=_text(meta.get("name")),
        uid=_text(meta.get("uid")),
        allocated=bool(allocation),
        results=results,
        classes=MappingProxyType(classes),
    )


def _consumed(result: Mapping[str, Any]) -> str | None:
    consumed = _mapping(result.get("consumedCapacity"))
    value = consumed.get(MEMORY)
    return _text(value) if value is not None else None
