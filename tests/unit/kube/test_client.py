"""What every request shares: the user agent, one line per error, which errors are worth a retry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from vramguard import __version__
from vramguard.kube.client import (
    MAX_ERROR_CHARS,
    RETRY_MAX_S,
    describe,
    forbidden_for_now,
    load_api_client,
    retry_backoff,
    status_message,
    transient,
    user_agent,
)


def api_error(status: int, body: object = None, reason: str = "Reason") -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = json.dumps(body) if body is not None and not isinstance(body, str) else body
    return e


def test_the_user_agent_names_the_agent_and_its_node() -> None:
    """client-go's shape: an operator tells agents apart in the audit log."""
    agent = user_agent("node-1")
    assert agent.startswith(f"vramguard/{__version__} (")
    assert agent.endswith(") node/node-1")
    assert user_agent(None) == agent.removesuffix(" node/node-1")


@pytest.mark.parametrize(
    ("error", "line"),
    [
        pytest.param(api_error(503, reason="Service Unavailable"), "503 Service Unavailable", id="api-status"),
        pytest.param(TimeoutError("read timed out"), "TimeoutError: read timed out", id="no-answer"),
    ],
)
def test_an_error_is_one_short_line(error: BaseException, line: str) -> None:
    """The status and reason of an API error; the type and text of anything else."""
    assert describe(error) == line


def test_a_long_error_is_cut() -> None:
    """A tenant-sized message costs a line, not kilobytes."""
    assert len(describe(ValueError("x" * 10_000))) <= MAX_ERROR_CHARS


@pytest.mark.parametrize(
    ("error", "retry"),
    [
        pytest.param(TimeoutError(), True, id="timeout"),
        pytest.param(ConnectionRefusedError(), True, id="refused"),
        pytest.param(api_error(0), True, id="no-status"),
        pytest.param(api_error(429), True, id="too-many-requests"),
        pytest.param(api_error(500), True, id="server-error"),
        pytest.param(api_error(504), True, id="gateway-timeout"),
        pytest.param(api_error(400), False, id="bad-request"),
        pytest.param(api_error(403), False, id="forbidden"),
        pytest.param(api_error(404), False, id="not-found"),
        pytest.param(api_error(409), False, id="conflict"),
    ],
)
def test_transient_errors_are_retried(error: BaseException, retry: bool) -> None:
    """No answer, or the server saying "later" (429, 5xx), is retried; any other answer is final."""
    assert transient(error) is retry


NAMESPACE_TERMINATING = {"details": {"causes": [{"reason": "NamespaceTerminating", "message": "ns is terminating"}]}}


@pytest.mark.parametrize(
    ("error", "for_now"),
    [
        pytest.param(api_error(403, {"message": "forbidden"}), True, id="rbac-not-loaded-yet"),
        pytest.param(api_error(403), True, id="no-body"),
        pytest.param(api_error(403, "not json"), True, id="unreadable-body"),
        pytest.param(api_error(403, NAMESPACE_TERMINATING), False, id="namespace-being-deleted-is-final"),
        pytest.param(api_error(404), False, id="not-a-403"),
        pytest.param(TimeoutError(), False, id="not-an-api-error"),
    ],
)
def test_a_403_may_mean_not_yet(error: BaseException, for_now: bool) -> None:
    """A just-started API server answers 403 before its authorizer has loaded RBAC; a write into a terminating
    namespace is refused for good."""
    assert forbidden_for_now(error) is for_now


@pytest.mark.parametrize(
    ("error", "message"),
    [
        pytest.param(api_error(409, {"message": "the object has been modified"}), "the object has been modified",
                     id="status-message"),
        pytest.param(api_error(500, {}, reason="Internal Server Error"), "Internal Server Error", id="no-message"),
        pytest.param(api_error(500, "<html>", reason="Bad Gateway"), "Bad Gateway", id="not-json"),
        pytest.param(api_error(500, None, reason="Internal"), "Internal", id="no-body"),
    ],
)  # fmt: skip
def test_the_status_message_or_the_reason(error: ApiException, message: str) -> None:
    """The Status object's message where the server sent one, its reason otherwise."""
    assert status_message(error) == message


def test_retries_back_off_to_the_maximum_with_jitter() -> None:
    """1 s, doubling up to RETRY_MAX_S, each stretched by up to as much again at random."""
    lowest, highest = retry_backoff(rng=lambda: 0.0), retry_backoff(rng=lambda: 1.0)
    assert [lowest.next() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, RETRY_MAX_S, RETRY_MAX_S]
    assert [highest.next() for _ in range(2)] == [2.0, 4.0]


def test_a_client_from_a_kubeconfig_leaves_retries_to_the_caller(tmp_path: Path) -> None:
    """urllib3 retries nothing (each retry is the caller's, paced), keepalive finds dropped connections, and every
    request names the agent and its node."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    api = load_api_client(str(kubeconfig), "node-1")
    assert api.configuration.host == "https://10.0.0.1:6443"
    assert api.configuration.retries is False
    assert api.user_agent == user_agent("node-1")
