"""The agent's own Node: its labels, kept by a reflector's list and watch events, and its absence said once."""

from __future__ import annotations

import functools
from typing import Any

from kubernetes import client
from structlog.testing import capture_logs

from vramguard.kube.nodes import NodeSource


def node(labels: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"name": "node-1", **({"labels": labels} if labels is not None else {})}}


def source() -> NodeSource:
    return NodeSource(client.ApiClient(), "node-1")  # constructed idle: its reflector is never started here


def test_watches_only_its_own_node() -> None:
    """The list and watch ask for one Node by name: a fleet of agents does not each watch every Node."""
    nodes = source()
    assert isinstance(nodes.reflector.list_call, functools.partial)
    assert nodes.reflector.list_call.keywords == {"field_selector": "metadata.name=node-1"}
    assert nodes.reflector.store is nodes


def test_labels_come_from_the_list_then_the_watch() -> None:
    """The labels as the API server has them, as text; a change replaces them, a delete leaves none."""
    nodes = source()
    assert nodes.labels() == {}
    nodes.replace([node({"nvidia.com/gpu.replicas": "4"})])
    assert nodes.labels() == {"nvidia.com/gpu.replicas": "4"}
    nodes.apply("MODIFIED", node({"nvidia.com/gpu.replicas": 2}))
    assert nodes.labels() == {"nvidia.com/gpu.replicas": "2"}
    nodes.apply("DELETED", node({"nvidia.com/gpu.replicas": "2"}))
    assert nodes.labels() == {}


def test_a_node_without_labels_has_none() -> None:
    """No labels field (or null) is no labels, not an error."""
    nodes = source()
    nodes.replace([node(None)])
    assert nodes.labels() == {}
    nodes.apply("MODIFIED", {"metadata": {"labels": None}})
    assert nodes.labels() == {}


def test_labels_are_replaced_never_mutated() -> None:
    """What `labels()` handed out stays as it was (the quota memo compares by identity), and an update that
    changes nothing keeps the same object."""
    nodes = source()
    nodes.replace([node({"a": "1"})])
    first = nodes.labels()
    nodes.apply("MODIFIED", node({"a": "1"}))
    assert nodes.labels() is first
    nodes.apply("MODIFIED", node({"a": "2"}))
    assert first == {"a": "1"} and nodes.labels() == {"a": "2"}


def test_a_missing_node_is_logged_once_and_a_label_change_each_time() -> None:
    """An empty list says the Node does not exist: one line for the run of it, another once it is gone again."""
    nodes = source()
    with capture_logs() as logs:
        nodes.replace([])
        nodes.replace([])
        nodes.replace([node({"a": "1"})])
        nodes.apply("MODIFIED", node({"a": "2"}))
        nodes.apply("MODIFIED", node({"a": "2"}))
        nodes.apply("DELETED", node({"a": "2"}))
    assert [entry["event"] for entry in logs] == ["node_not_found", "node_labels_changed", "node_not_found"]
