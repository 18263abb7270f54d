"""Where pods come from and where Events and evictions go (`connect`): the API server, or a pods file and the log;
and what is built over the API server beside them (the capacity publisher). Nothing is started here."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubernetes.client import ApiClient

from vramguard.agent.metrics import Metrics
from vramguard.agent.watch import ScanCalls
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.lifecycle import Service, Services
from vramguard.cli.config import ScanSetup, WiringError
from vramguard.core.policy import Policy
from vramguard.core.ports import EventRecorder, Evictor
from vramguard.core.sources import reads_claims
from vramguard.kube.capacity import KubeCapacityPublisher
from vramguard.kube.claims import KubeClaimSource
from vramguard.kube.client import load_api_client
from vramguard.kube.events import KubeEventRecorder, KubeEventSink
from vramguard.kube.eviction import KubeEvictor
from vramguard.kube.no_api import LogEventRecorder, NoApiEvictor
from vramguard.kube.pods import KubePodSource
from vramguard.kube.pods_file import FilePodSource
from vramguard.node.api_uids import ApiUids
from vramguard.node.kubelet_pods import KubeletPods


@dataclass
class Cluster:
    """Where pods come from and where Events and evictions go: the API server, or a pods file and the log.
    `parts` are its background parts, built idle, in the order they start (`start`)."""

    pods: FilePodSource | KubePodSource
    events: EventRecorder
    evictor: Evictor
    api: ApiClient | None = None
    claims: KubeClaimSource | FilePodSource | None = None  # with a `claim:` quota source
    parts: tuple[tuple[str, Service], ...] = ()
    # Where scans are called for between polls: by the pod sources (a pod learned late) and the memory watch.
    scan_calls: ScanCalls | None = None
    # The UIDs the API server gave this node's pods: only theirs can be orphans (`core/orphans.py`).
    api_uids: ApiUids = field(default_factory=ApiUids)

    def start(self, services: Services) -> None:
        """Start the background parts in `services`, which stops them in reverse."""
        for name, part in self.parts:
            services.start(name, part)


def connect(
    setup: ScanSetup, metrics: Metrics, clock: Clock = SYSTEM_CLOCK, api_uids: ApiUids | None = None
) -> Cluster:
    """The pods file and the log, or the API server (pods watched in the background, Events on a writer, and
    where the policy reads quotas from DRA claims, this node's ResourceSlices and its pods' claims), and the
    kubelet's own word on its pods (`KubeletPods`, which mirror claims are judged by). `api_uids`: the UIDs the
    API server gave this node's pods, kept across restarts (in memory when None). Nothing is started:
    `Cluster.start`."""
    policy, pods_file, node_name = setup.policy, setup.pods_file, setup.node_name
    api_uids = api_uids if api_uids is not None else ApiUids()
    kubelet = KubeletPods(setup.pod_logs_dir, clock=clock)
    claim_sources = reads_claims(policy.quota_sources)
    calls = scan_calls(policy, metrics, clock)
    on_pods = calls.pods_updated if calls is not None else None
    if pods_file is not None:
        from_file = FilePodSource(
            str(pods_file), node_name=node_name, clock=clock, on_pods=on_pods, kubelet=kubelet, api_uids=api_uids
        )
        kubelet.on_change = from_file.rejudge
        metrics.mirror_claims_refused.set_function(lambda: len(from_file.refused()))
        # The file's ResourceClaims and ResourceSlices, read with its pods.
        file_claims = from_file if claim_sources else None
        parts: tuple[tuple[str, Service], ...] = (("kubelet-pods", kubelet), ("pods-file", from_file))
        return Cluster(
            from_file, LogEventRecorder(), NoApiEvictor(), claims=file_claims, parts=parts, scan_calls=calls,
            api_uids=api_uids,
        )  # fmt: skip
    if not node_name:
        raise WiringError("--node-name (or NODE_NAME) is required to watch this node's pods")
    try:
        api = load_api_client(setup.kubeconfig, node_name)
    except Exception as e:  # the client raises several unrelated types for a bad or missing configuration
        where = setup.kubeconfig or "the in-cluster ServiceAccount"
        raise WiringError(f"cannot load the Kubernetes configuration from {where}: {e}") from None
    events = KubeEventRecorder(
        KubeEventSink(api, node_name),
        count=lambda result: metrics.events.labels(result=result.value).inc(),
        clock=clock,
    )
    metrics.events_queued.set_function(events.queued)

    def count(resource: str, verb: str) -> None:
        metrics.api_requests.labels(resource=resource, verb=verb).inc()

    pods = KubePodSource(api, node_name, count=count, clock=clock, on_pods=on_pods, kubelet=kubelet, api_uids=api_uids)
    kubelet.on_change = pods.rejudge
    metrics.mirror_claims_refused.set_function(lambda: len(pods.refused()))
    kube_parts: list[tuple[str, Service]] = [("events", events), ("kubelet-pods", kubelet), ("pods", pods)]
    claims = None
    if claim_sources:
        claims = KubeClaimSource(api, node_name, pods, count=count, clock=clock)
        kube_parts.append(("claims", claims))  # after the pods: it reads the claims the pods name
    return Cluster(pods, events, KubeEvictor(api, clock=clock), api, claims, tuple(kube_parts), calls, api_uids)


def scan_calls(policy: Policy, metrics: Metrics, clock: Clock) -> ScanCalls | None:
    """Where scans are called for between polls (`watch.ScanCalls`), None with `watch_interval: 0s` (then a pod
    update calls for none either)."""
    if policy.watch_interval_s <= 0:
        return None
    return ScanCalls(policy, clock, count_held=metrics.scan_triggers_held.inc)


def capacity_publisher(
    cluster: Cluster, node_name: str | None, reserve_bytes: int, advertise: bool, dry_run: bool, clock: Clock
) -> KubeCapacityPublisher | None:
    """The publisher, not started; it withdraws what an earlier run may have advertised when not advertising
    (once started, in the background like every publish: a failure is logged, never raised, never waited for)."""
    if cluster.api is None or node_name is None or dry_run:
        return None
    publisher = KubeCapacityPublisher(cluster.api, node_name, reserve_bytes, clock=clock)
    if not advertise:
        publisher.withdraw()
    return publisher
