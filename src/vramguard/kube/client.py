"""Client set-up and what every request shares: the user agent, the timeouts, and how errors are told apart.

urllib3's own retries are off: every retry is the caller's, with jittered back-off (`vramguard.base.backoff`), so a
request timeout is never silently multiplied.
"""

from __future__ import annotations

import json
import platform
import random
from collections.abc import Callable
from typing import Final

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from vramguard import __version__
from vramguard.base.backoff import Backoff
from vramguard.core.text import cut

# (connect, read) seconds. The read timeout bounds each wait for the server's next bytes.
TIMEOUT_WRITE: Final = (5.0, 10.0)
TIMEOUT_LIST: Final = (5.0, 30.0)
TIMEOUT_GET: Final = (3.0, 5.0)

MAX_ERROR_CHARS: Final = 300

# A failed request is retried after 1 s, doubling up to this, each delay stretched by up to as much again at random:
# back within 30 s of the server, and a fleet's retries never line up.
RETRY_MAX_S: Final = 15.0
# An API server that has just started answers before its authorizer has loaded RBAC: a 403 then means "not yet".
# A caller that must not give up (a watch) retries it like any error; one that must end (a write) this long.
FORBIDDEN_GRACE_S: Final = 30.0


def user_agent(node_name: str | None) -> str:
    """`vramguard/<version> (<os>/<arch>) node/<name>`, client-go's shape: an operator can tell the agents' load
    apart in the audit log, and one agent from another."""
    system = f"{platform.system().lower()}/{platform.machine().lower()}"
    agent = f"vramguard/{__version__} ({system})"
    return f"{agent} node/{node_name}" if node_name else agent


def load_api_client(kubeconfig: str | None, node_name: str | None = None) -> client.ApiClient:
    """An API client from a kubeconfig file, or the in-cluster ServiceAccount when none is given."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.retries = False
    # TCP keepalive with client-go's timings: a watch on a connection that a proxy or a NAT dropped silently is
    # found dead within 30 + 9 x 15 s, not only when the watch's own timeout has passed.
    configuration.keep_alive = True
    api = client.ApiClient(configuration)
    api.user_agent = user_agent(node_name)
    return api


def describe(e: BaseException) -> str:
    """An error in one short line, for logs and probes."""
    if isinstance(e, ApiException):
        return f"{e.status} {e.reason}"
    return cut(f"{type(e).__name__}: {e}", MAX_ERROR_CHARS)


def retry_backoff(rng: Callable[[], float] = random.random) -> Backoff:
    """The pace of every retried request (`RETRY_MAX_S`): a reflector's watch, an Event write."""
    return Backoff(1.0, RETRY_MAX_S, jitter=1.0, rng=rng)


def transient(e: BaseException) -> bool:
    """Worth retrying: no answer (timeouts, refused connections) or the server saying "later"."""
    if isinstance(e, ApiException):
        return not e.status or e.status == 429 or e.status >= 500
    return True


def forbidden_for_now(e: BaseException) -> bool:
    """A 403 that may mean "not yet" (`FORBIDDEN_GRACE_S`): any but the refusal to write into a namespace being
    deleted, which is final."""
    if not isinstance(e, ApiException) or e.status != 403:
        return False
    try:
        causes = (json.loads(e.body or "{}").get("details") or {}).get("causes") or []
    except (ValueError, AttributeError):
        return True
    return not any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes)


def status_message(e: ApiException) -> str:
    """The message of the Status object the API server answered with."""
    try:
        return cut(str(json.loads(e.body or "{}").get("message") or e.reason), MAX_ERROR_CHARS)
    except ValueError:
        return str(e.reason)
