"""What the API server tells the agent about a pod: its keys, a static pod's two UIDs, its containers by ID."""

from __future__ import annotations

from vramguard.core.pod import ContainerInfo, NodeRef, PodInfo

POD_UID = "5f3c2b1a-0000-4000-8000-000000000002"


def test_a_static_pod_is_known_to_the_api_server_by_its_mirror() -> None:
    """`uid` names the cgroup; `object_uid` the API object (the mirror pod's for a static pod)."""
    plain = PodInfo(POD_UID, "ml", "trainer")
    static = PodInfo("0123456789abcdef0123456789abcdef", "kube-system", "etcd-node1", mirror_uid=POD_UID)
    assert (plain.key, plain.static, plain.object_uid) == ("ml/trainer", False, POD_UID)
    assert (static.key, static.static, static.object_uid) == ("kube-system/etcd-node1", True, POD_UID)


def test_containers_are_found_by_runtime_id() -> None:
    """Attribution's lookup: a running container by its ID; none for an unknown ID or one not yet running."""
    main = ContainerInfo("main", container_id="c0ffee")
    pod = PodInfo(POD_UID, "ml", "trainer", containers=(main, ContainerInfo("init")))
    assert pod.container_by_id("c0ffee") is main
    assert pod.container_by_id("beef") is None


def test_a_node_is_an_events_object_as_the_kubelet_writes_it() -> None:
    """A GPU fault's Event is about the Node: in "default", with the node's name as its UID."""
    node = NodeRef("gpu-node-1")
    assert (node.uid, node.namespace, node.key) == ("gpu-node-1", "default", "node/gpu-node-1")
