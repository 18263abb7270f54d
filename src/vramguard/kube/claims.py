"""The claim source: this node's ResourceSlices (a reflector) and the ResourceClaims of its pods (one paced GET
per claim, by name), read into `shares.PodShares`. RBAC: get on resourceclaims; list and watch on resourceslices.

Why claims are read by name and when they are read again: docs/architecture.md "Reading DRA claims".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vramguard.base.background import BackgroundLoop
from vramguard.base.backoff import TokenBucket
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.core.pod import PodInfo
from vramguard.core.ports import PodSource
from vramguard.core.shares import (
    Claim,
    ClaimKey,
    DeviceKey,
    PodShares,
    SliceDevice,
    claim_keys,
    pod_shares,
)
from vramguard.kube.claim_manifest import claim_from_manifest, slice_devices
from vramguard.kube.client import TIMEOUT_GET, describe
from vramguard.kube.reflector import Log, Reflector, RequestCounter, uncounted

GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
# A claim missing or not allocated yet is read again after RETRY_S, doubling up to RETRY_MAX_S while it stays so.
RETRY_S: Final = 10.0
RETRY_MAX_S: Final = 300.0
# A node filling with 200 pods reads their claims within seconds, without a burst of 200 requests.
GETS_PER_S: Final = 20.0
GETS_BURST: Final = 50
CYCLE_S: Final = 0.5  # how often the claim reader looks at the pod cache (memory only)
UNSERVED_RETRY_S: Final = 300.0


class KubeClaimSource:
    """The DRA shares of the pods of one node (`ClaimSource`): a reflector for the slices, a thread for the claims."""

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        pods: PodSource,
        *,
        retry_s: float = RETRY_S,
        retry_max_s: float = RETRY_MAX_S,
        gets_per_s: float = GETS_PER_S,
        log: Log | None = None,
        clock: Clock = SYSTEM_CLOCK,
        count: RequestCounter = uncounted,
    ) -> None:
        self.objects = client.CustomObjectsApi(api)
        self.node_name = node_name
        self.pods = pods
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.clock = clock
        self._synced = threading.Event()  # set by the claim thread once `synced()` held with the pods synced
        self._gets = TokenBucket(GETS_BURST, gets_per_s * 60.0, clock)
        self._slices: dict[str, dict[DeviceKey, SliceDevice]] = {}  # by ResourceSlice name
        self._devices: Mapping[DeviceKey, SliceDevice] = {}
        self._claims: dict[ClaimKey, Claim | None] = {}  # None: the API server says it does not exist
        self._due: dict[ClaimKey, float] = {}  # when each unsettled claim is to be read (again)
        self._misses: dict[ClaimKey, int] = {}  # reads in a row that found it unusable (missing, unallocated, error)
        self._shares: Mapping[str, PodShares] = {}
        self._version = 0  # bumped whenever a claim read differs (by the claim thread only)
        self._seen: tuple[object, object, int] | None = None  # (pods, devices, version) of the shares
        self._unserved = False  # the API server answered 404 for the slices: it has no resource.k8s.io/v1
        self._read_failures = FailureRun()  # claim GETs failing: logged once per run, not once per claim
        self._known: dict[str, frozenset[ClaimKey]] = {}  # pod UID → the claims it named when last seen
        self._seen_pods: object = None  # the pods as the claim thread last saw them
        self.claim_gets = 0  # requests made, for tests and logs
        self.cycles = 0  # claim-thread cycles completed: a test waits for some to show that nothing was read
        self.slices = Reflector(
            "resourceslices",
            self._slice_call,
            self,
            log=self.log,
            clock=clock,
            retry_after=self._unserved_retry,
            count=count,
        )
        self.loop = BackgroundLoop("vramguard-claims", self._read_claims, clock=clock, log=self.log)

    def start(self) -> None:
        self.slices.start()
        self.loop.start()

    def stop(self, deadline: float) -> None:
        self.loop.stopping.set()  # a claim read in flight stops reading the rest of its cycle
        self.slices.stop(deadline)
        self.loop.stop(deadline)

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until the pods were synced and every claim they name was read once (`synced()`), `timeout_s` at
        most; True when that happened."""
        return self._synced.wait(timeout_s)

    @property
    def slice_lists(self) -> int:
        return self.slices.lists

    # -- ClaimSource ----------------------------------------------------------------------------------------

    def shares(self) -> Mapping[str, PodShares]:
        """By pod UID; replaced, never mutated, and each pod's entry kept as the same object while it holds."""
        return self._shares

    def problem(self) -> str | None:
        if self._unserved:
            return f"the API server does not serve {GROUP}/{VERSION} (Kubernetes 1.34 or later has it)"
        return self.slices.problem()

    def synced(self) -> bool:
        """The slices were listed and every claim the pods name was read at least once (or the API server does not
        serve resource.k8s.io/v1: there is nothing to read)."""
        if self._unserved:
            return True  # nothing to read: no claim source on this API server, as problem() says
        pods_named = {key for pod in self.pods.pods().values() for key in claim_keys(pod)}
        seen = self._seen  # and the shares published are those of what was read
        published = seen is not None and seen[1] is self._devices and seen[2] == self._version
        # Membership tests only: the claim thread may be adding to the dict meanwhile.
        return self.slices.listed and published and all(key in self._claims for key in pods_named)

    # -- ResourceSlices --------------------------------------------------------------------------------------

    def _slice_call(self, **kwargs: Any) -> Any:
        return self.objects.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices", field_selector=f"spec.nodeName={self.node_name}", **kwargs
        )

    def _unserved_retry(self, e: Exception) -> float | None:
        """A 404 for the slices: this API server has no resource.k8s.io/v1; ask again, rarely."""
        unserved = isinstance(e, ApiException) and e.status == 404
        if unserved and not self._unserved:
            self.log.warning("claim_source_unavailable", problem=self.problem() or "", retry_in_s=UNSERVED_RETRY_S)
        self._unserved = unserved
        return UNSERVED_RETRY_S if unserved else None

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        self._slices = {str((item.get("metadata") or {}).get("name")): slice_devices(item) for item in items}
        self._unserved = False
        self._publish_devices()

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        slices = dict(self._slices)
        if kind == "DELETED":
            slices.pop(name, None)
        else:
            slices[name] = slice_devices(obj)
        self._slices = slices
        self._publish_devices()

    def _publish_devices(self) -> None:
        devices: dict[DeviceKey, SliceDevice] = {}
        for published in self._slices.values():
            devices.update(published)
        if devices != self._devices:
            self._devices = devices  # replaced, never mutated: the claim thread notices a new object

    # -- ResourceClaims --------------------------------------------------------------------------------------

    def _read_claims(self) -> float:
        self.read_once()
        self.cycles += 1
        return CYCLE_S

    def read_once(self) -> None:
        """One cycle of the claim thread: note the pods' claims, read those due (paced), publish the shares."""
        pods = self.pods.pods()
        now = self.clock.now()
        if pods is not self._seen_pods:
            self._known = self._note_pods(pods, self._known, now)
            self._seen_pods = pods
        # Claims are read once the slices were listed: where the API server does not serve resource.k8s.io/v1
        # every GET would answer 404, and a claim that merely cannot be read would be reported missing; and
        # without this node's slices no share could be placed on a GPU anyway.
        readable = self.slices.listed and not self._unserved
        for key in sorted(k for k, at in self._due.items() if at <= now) if readable else ():
            if self.loop.stopping.is_set() or not self._gets.take():
                break  # paced: the rest next cycle
            self._get(key)
        self._publish_shares(pods)
        if not self._synced.is_set() and self.pods.synced() and self.synced():
            self._synced.set()

    def _note_pods(
        self, pods: Mapping[str, PodInfo], known: dict[str, frozenset[ClaimKey]], now: float
    ) -> dict[str, frozenset[ClaimKey]]:
        """Which claims to read: every claim of a pod new to the agent (a claim may be reallocated between the pods
        that use it), a claim newly named by a pod, and the missing or unallocated claims of a changed pod; forget
        the claims no pod uses any more."""
        named: dict[str, frozenset[ClaimKey]] = {}
        for uid, pod in pods.items():
            keys = frozenset(claim_keys(pod))
            named[uid] = keys
            before = known.get(uid)
            for key in keys:
                unsettled = key in self._claims and not _settled(self._claims[key])
                if before is None or key not in before or key not in self._claims or unsettled:
                    self._due[key] = min(self._due.get(key, now), now)
        used = frozenset().union(*named.values()) if named else frozenset()
        for key in [k for k in self._due.keys() | self._claims.keys() if k not in used]:
            self._due.pop(key, None)
            self._misses.pop(key, None)
            if key in self._claims:
                del self._claims[key]
                self._version += 1
        return named

    def _get(self, key: ClaimKey) -> None:
        namespace, name = key
        self.claim_gets += 1
        try:
            resp: Any = self.objects.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name, _preload_content=False, _request_timeout=TIMEOUT_GET
            )
            claim: Claim | None = claim_from_manifest(json.loads(resp.data))
        except Exception as e:
            if not (isinstance(e, ApiException) and e.status == 404):
                # A timeout, a refused connection, a 5xx: keep what was read, try again soon. Logged once per
                # run of failures, not once per claim nor per error text: 200 claims on a frozen API server
                # are one line.
                if not self._read_failures.failing:
                    self.log.warning("claim_read_failed", claim=f"{namespace}/{name}", error=describe(e))
                self._read_failures.failed(describe(e))
                self._due[key] = self.clock.now() + self._retry_in(key)
                return
            claim = None
        last_error = self._read_failures.error
        if self._read_failures.ok():
            self.log.info("claim_read_recovered", claim=f"{namespace}/{name}", last_error=last_error)
        if key not in self._claims or self._claims[key] != claim:
            self._claims[key] = claim
            self._version += 1
        if _settled(claim):  # read again only when a pod new to the agent names it
            self._misses.pop(key, None)
            self._due.pop(key, None)
        else:
            self._due[key] = self.clock.now() + self._retry_in(key)

    def _retry_in(self, key: ClaimKey) -> float:
        """When to read an unusable claim again: `retry_s`, doubling with each miss in a row up to `retry_max_s`,
        so pods naming claims that never come (a tenant can bind pods to a node by hand) cost little."""
        misses = self._misses.get(key, 0)
        self._misses[key] = misses + 1
        return min(self.retry_max_s, self.retry_s * float(2 ** min(misses, 16)))

    def _publish_shares(self, pods: Mapping[str, PodInfo]) -> None:
        """Recompute every pod's shares from what was read; an unchanged pod keeps its object (QuotaBook's cache)."""
        devices = self._devices
        seen = self._seen
        if seen is not None and seen[0] is pods and seen[1] is devices and seen[2] == self._version:
            return
        self._seen = (pods, devices, self._version)
        old = self._shares
        shares: dict[str, PodShares] = {}
        for uid, pod in pods.items():
            if not pod.claims:
                continue
            held = pod_shares(pod, self._claims, devices)
            if held:
                shares[uid] = old[uid] if uid in old and old[uid] == held else held
        self._shares = shares


def _settled(claim: Claim | None) -> bool:
    """An allocated claim does not change while a pod uses it; a missing or unallocated one may at any moment."""
    return claim is not None and claim.allocated
