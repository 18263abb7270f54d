"""policy/v1 Eviction of a pod, so PodDisruptionBudgets are respected: one POST per decided eviction, made on the
enforcer's worker; a 429 (a budget says no) is retried `attempts` times with jittered back-off, then reported
refused."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, UNINTERRUPTED, Clock
from vramguard.core.pod import PodInfo
from vramguard.core.ports import EvictResult
from vramguard.kube.client import TIMEOUT_WRITE, describe, status_message


class KubeEvictor:
    """policy/v1 Eviction, so PodDisruptionBudgets are respected. Preconditioned on the pod's UID: a pod
    re-created under the same name is never evicted for its predecessor's usage.

    Blocking, with request timeouts: the enforcer calls it from its background worker, never from the scan.
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        attempts: int = 3,
        backoff: Callable[[], Backoff] = lambda: Backoff(0.5, 4.0),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.attempts = attempts
        self.backoff = backoff
        self.clock = clock

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace),
            delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.object_uid)),
        )
        last = ""
        backoff = self.backoff()
        for attempt in range(self.attempts):
            try:
                self.core.create_namespaced_pod_eviction(pod.name, pod.namespace, body, _request_timeout=TIMEOUT_WRITE)
                return EvictResult(evicted=True, refused=False)
            except ApiException as e:
                if e.status == 429:
                    last = status_message(e)
                    if attempt + 1 < self.attempts:
                        self.clock.wait(UNINTERRUPTED, backoff.next())
                    continue
                if e.status in (404, 409):  # gone already, or a new pod under the old name
                    return EvictResult(evicted=False, refused=False, gone=True, message=status_message(e))
                return EvictResult(evicted=False, refused=False, message=f"{e.status}: {status_message(e)}")
            except Exception as e:  # no answer: a timeout, a refused connection
                return EvictResult(evicted=False, refused=False, message=describe(e))
        return EvictResult(evicted=False, refused=True, message=last)
