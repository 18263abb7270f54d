"""Finding the agents and reading their `/status` through the API server's pod proxy.

The API server reaches each agent's metrics port (`pods/proxy`, a GET), so the plugin needs no route to the pod
network, only the `vramguard-viewer` ClusterRole. Agents are read concurrently, a bounded number at a time, each
within its own deadline and body bound: a hung or huge agent costs its own row, never the whole answer.

`top` and `nodes` show every pod with the chart's name label; `recommend` judges by what it reads, so it reads only
one release's (`Release`): its DaemonSet's pods in its namespace, and its policy ConfigMap there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError, TimeoutError

from vramguard import __version__
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.core.documents import DocumentError, load_json
from vramguard.core.policy import PolicyText
from vramguard.core.text import cut
from vramguard.kube.client import describe, status_message
from vramguard.plugin.merge import AgentRef, Answer, Failure, Fetched

AGENT_SELECTOR = "app.kubernetes.io/name=vramguard"
PORT_NAME = "metrics"  # the chart's name for the agent's metrics port
MAX_LIST_BYTES = 64 * 1024 * 1024  # a page of LIST_PAGE objects; 500 pods are about 4 MB
DEFAULT_PORT = 9400
MAX_BODY_BYTES = 8 * 1024 * 1024  # the agent keeps its document well under this
CHUNK_BYTES = 64 * 1024
WORKERS = 16
TIMEOUT_S = 5.0
LIST_TIMEOUT = (5.0, 30.0)
_SERVICEACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ConfigError(Exception):
    """No usable Kubernetes configuration."""


@dataclass(frozen=True, slots=True)
class Release:
    """One install of the chart: the objects its templates name (`_helpers.tpl`), in its namespace."""

    namespace: str
    name: str  # `helm install <name>`

    @property
    def daemonset(self) -> str:
        """The chart's "vramguard.name": the release's name, cut to 50 characters, less a trailing '-'."""
        return self.name[:50].removesuffix("-")

    @property
    def policy_config_map(self) -> str:
        return f"{self.daemonset}-policy"

    @property
    def pod_selector(self) -> str:
        """The DaemonSet's selector labels."""
        return f"{AGENT_SELECTOR},app.kubernetes.io/instance={self.name}"

    @property
    def scrape_selector(self) -> str:
        """The agents' targets as the chart's ServiceMonitor makes them: its Service names the job, in the release's
        namespace (a label of the target; a ServiceMonitor elsewhere gets its own namespace)."""
        return f"job={json.dumps(self.daemonset + '-metrics')},namespace={json.dumps(self.namespace)}"


@dataclass(frozen=True, slots=True)
class AgentPod:
    ref: AgentRef
    port: int
    phase: str
    controller: str = ""  # "<kind>/<name>" of its controller reference ("DaemonSet/vramguard"); "" for none


def load_api(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """An API client from the kubeconfig (`KUBECONFIG`, ~/.kube/config) or, inside a pod, its ServiceAccount; and
    the namespace the context names (kubectl's default for `-n`)."""
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)  # type: ignore[no-untyped-call]
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        chosen = active
        if context:
            contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            chosen = next((c for c in contexts if c.get("name") == context), active)
        namespace = str((chosen or {}).get("context", {}).get("namespace") or "default")
    except Exception as e:  # the client raises several unrelated types for a bad or missing configuration
        if kubeconfig or context or not _SERVICEACCOUNT_NAMESPACE.exists():
            raise ConfigError(f"cannot load the Kubernetes configuration: {cut(str(e), 300)}") from None
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        namespace = _SERVICEACCOUNT_NAMESPACE.read_text().strip() or "default"
    configuration.retries = False  # one try per agent, within its deadline
    api = client.ApiClient(configuration)
    api.user_agent = f"kubectl-vramguard/{__version__}"
    return api, namespace


def connect_core(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """`load_api`'s client as a CoreV1Api, and the context's namespace."""
    api, namespace = load_api(kubeconfig, context)
    return client.CoreV1Api(api), namespace


def _port(pod: Mapping[str, Any]) -> int:
    """The container port named `metrics`, else the first one, else the chart's default."""
    ports = [p for c in pod.get("spec", {}).get("containers") or [] for p in c.get("ports") or []]
    named = [p for p in ports if p.get("name") == PORT_NAME] or ports
    port = named[0].get("containerPort") if named else None
    return port if isinstance(port, int) else DEFAULT_PORT


def agent_from_pod(pod: Mapping[str, Any]) -> AgentPod:
    meta = pod.get("metadata", {})
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict) and o.get("controller")]
    controller = f"{owners[0].get('kind', '')}/{owners[0].get('name', '')}" if owners else ""
    return AgentPod(
        AgentRef(
            str(meta.get("namespace", "")), str(meta.get("name", "")), str(pod.get("spec", {}).get("nodeName") or "")
        ),
        _port(pod),
        str(pod.get("status", {}).get("phase") or "Unknown"),
        controller,
    )


def _page(resp: Any) -> dict[str, Any]:
    """A LIST answer's body, bounded in size and depth. Raises DocumentError."""
    body = load_json(resp.data, max_bytes=MAX_LIST_BYTES)
    if not isinstance(body, dict):
        raise DocumentError(f"a list answer is a JSON object, not a {type(body).__name__}")
    return body


def find_agents(
    core: Any,
    namespace: str | None = None,
    node: str | None = None,
    selector: str = AGENT_SELECTOR,
    timeout: tuple[float, float] = LIST_TIMEOUT,
) -> list[AgentPod]:
    """The agent pods, by `selector` (the chart's name label): in `namespace` (None: all), on `node` (None: all)."""
    match: dict[str, Any] = {"label_selector": selector, "limit": 500}
    if node:
        match["field_selector"] = f"spec.nodeName={node}"
    pods: list[AgentPod] = []
    cont: str | None = None
    while True:
        if cont:
            match["_continue"] = cont
        if namespace:
            resp = core.list_namespaced_pod(namespace, _preload_content=False, _request_timeout=timeout, **match)
        else:
            resp = core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=timeout, **match)
        body = _page(resp)
        pods.extend(agent_from_pod(p) for p in body.get("items") or [] if isinstance(p, dict))
        cont = (body.get("metadata") or {}).get("continue")
        if not cont:
            return sorted(pods, key=lambda a: (a.ref.node, a.ref.namespace, a.ref.pod))


def release_agents(
    core: Any, release: Release, timeout: tuple[float, float] = LIST_TIMEOUT
) -> tuple[list[AgentPod], list[AgentPod]]:
    """The pods of the release's DaemonSet in its namespace; and the pods there with its labels that another
    controller (or none) made, left out."""
    found = find_agents(core, release.namespace, selector=release.pod_selector, timeout=timeout)
    ours = f"DaemonSet/{release.daemonset}"
    return [a for a in found if a.controller == ours], [a for a in found if a.controller != ours]


def _api_error(e: ApiException, role: str = "vramguard-viewer") -> str:
    text = f"{e.status} {e.reason}"
    try:
        body = json.loads(e.body or "")
    except (ValueError, TypeError):
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":  # the API server's own answer
        text += f": {status_message(e)}"
        if e.status == 403:
            text += f" (bind the {role} ClusterRole)"
    elif e.status == 404:  # the agent's: it serves no /status
        text += ": the agent serves no /status (older than this plugin?)"
    return text


def read_status(core: Any, agent: AgentPod, timeout_s: float = TIMEOUT_S, clock: Clock = SYSTEM_CLOCK) -> Fetched:
    """One agent's status document, or why there is none. Never raises for the agent's sake."""
    if agent.phase != "Running":
        return Failure(agent.ref, f"pod is {agent.phase}")
    deadline = clock.now() + timeout_s
    try:
        resp = core.connect_get_namespaced_pod_proxy_with_path(
            f"{agent.ref.pod}:{agent.port}",
            agent.ref.namespace,
            "status",
            _preload_content=False,
            _request_timeout=(timeout_s, timeout_s),
        )
        try:
            chunks: list[bytes] = []
            size = 0
            while chunk := resp.read(CHUNK_BYTES):
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    return Failure(agent.ref, f"status body over {MAX_BODY_BYTES} bytes")
                if clock.now() > deadline:
                    return Failure(agent.ref, f"timed out after {timeout_s:g}s")
                chunks.append(chunk)
        finally:
            resp.release_conn()
        document = load_json(b"".join(chunks), max_bytes=MAX_BODY_BYTES)
    except ApiException as e:
        return Failure(agent.ref, _api_error(e))
    except (TimeoutError, MaxRetryError, ProtocolError) as e:
        reason = getattr(e, "reason", None)
        # urllib3's NewConnectionError (refused, unreachable) is a kind of its ConnectTimeoutError.
        timed_out = isinstance(e, TimeoutError) or isinstance(reason, TimeoutError)
        if timed_out and not isinstance(reason, NewConnectionError):
            return Failure(agent.ref, f"timed out after {timeout_s:g}s")
        return Failure(agent.ref, describe(reason if isinstance(reason, BaseException) else e))
    except DocumentError as e:
        return Failure(agent.ref, f"unreadable JSON: {cut(str(e), 200)}")
    except Exception as e:  # anything else is this agent's row, not the end of the others
        return Failure(agent.ref, describe(e))
    if not isinstance(document, dict):
        return Failure(agent.ref, f"not a status document (a JSON {type(document).__name__})")
    return Answer(agent.ref, document)


def read_all(
    core: Any,
    agents: Sequence[AgentPod],
    workers: int = WORKERS,
    timeout_s: float = TIMEOUT_S,
    clock: Clock = SYSTEM_CLOCK,
) -> list[Fetched]:
    """Every agent's answer, in `agents`' order, at most `workers` read at a time."""
    if not agents:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(agents))), thread_name_prefix="vramguard-read") as pool:
        return list(pool.map(lambda a: read_status(core, a, timeout_s, clock), agents))


# --------------------------------------------------------------------------------------------------------------
# What `recommend` reads of the cluster: the owners of the pods, and the agents' policy.

_LISTS: dict[str, tuple[str, str, str]] = {  # kind → (API class, method for one namespace, for all)
    "Pod": ("CoreV1Api", "list_namespaced_pod", "list_pod_for_all_namespaces"),
    "ReplicaSet": ("AppsV1Api", "list_namespaced_replica_set", "list_replica_set_for_all_namespaces"),
    "Deployment": ("AppsV1Api", "list_namespaced_deployment", "list_deployment_for_all_namespaces"),
    "StatefulSet": ("AppsV1Api", "list_namespaced_stateful_set", "list_stateful_set_for_all_namespaces"),
    "DaemonSet": ("AppsV1Api", "list_namespaced_daemon_set", "list_daemon_set_for_all_namespaces"),
    "Job": ("BatchV1Api", "list_namespaced_job", "list_job_for_all_namespaces"),
    "CronJob": ("BatchV1Api", "list_namespaced_cron_job", "list_cron_job_for_all_namespaces"),
}
LIST_PAGE = 500


class KubeReader:
    """Lists of the kinds that own pods (`workloads.KINDS`), paged, as plain dicts; and the agents' policy."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.requests = 0  # API requests made, for the figures

    def list_objects(
        self, kind: str, namespace: str | None, timeout: tuple[float, float] = LIST_TIMEOUT
    ) -> list[dict[str, Any]]:
        api_class, one, every = _LISTS[kind]
        target = getattr(client, api_class)(self.api)
        items: list[dict[str, Any]] = []
        match: dict[str, Any] = {"limit": LIST_PAGE}
        while True:
            self.requests += 1
            if namespace is not None:
                resp = getattr(target, one)(namespace, _preload_content=False, _request_timeout=timeout, **match)
            else:
                resp = getattr(target, every)(_preload_content=False, _request_timeout=timeout, **match)
            body = _page(resp)
            items.extend(i for i in body.get("items") or [] if isinstance(i, dict))
            cont = (body.get("metadata") or {}).get("continue")
            if not cont:
                return items
            match["_continue"] = cont

    def config_map_data(self, namespace: str, name: str, timeout: tuple[float, float]) -> Mapping[str, str]:
        """A ConfigMap's `data`. Raises what the client raises."""
        config_map = client.CoreV1Api(self.api).read_namespaced_config_map(name, namespace, _request_timeout=timeout)
        return config_map.data or {}

    def policy_text(
        self, release: Release, timeout: tuple[float, float] = LIST_TIMEOUT
    ) -> tuple[PolicyText | None, str]:
        """The policy the release's agents run with (its ConfigMap, in its namespace, every key of it as they
        mount it), or None and why not."""
        where = f"{release.namespace}/{release.policy_config_map}"
        try:
            data = self.config_map_data(release.namespace, release.policy_config_map, timeout)
        except ApiException as e:
            return None, f"cannot read {where}: {_api_error(e, 'vramguard-recommender')}"
        except Exception as e:  # the API server unreachable: the caller says so, with the default policy
            return None, f"cannot read {where}: {describe(e)}"
        return PolicyText.of_config_map(data), where


def connect_reader(kubeconfig: str | None, context: str | None) -> tuple[KubeReader, Any, str]:
    """`load_api`'s client as a KubeReader and a CoreV1Api (for the agents), and the context's namespace."""
    api, namespace = load_api(kubeconfig, context)
    return KubeReader(api), client.CoreV1Api(api), namespace
