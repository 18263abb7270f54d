"""CgroupfsTree reads a cgroup filesystem's layout and files; here a plain directory tree shaped like one."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramguard.node.cgroup_tree import CgroupfsTree

UID = "0b1c2d3e-0000-4000-8000-000000000001"
CID = "a" * 64
OTHER = "b" * 64


def _kubelet_tree(root: Path) -> Path:
    """A v2 hierarchy with one besteffort pod (cgroupfs driver) holding one container; the pod's directory."""
    (root / "cgroup.controllers").write_text("memory\n")
    pod_dir = root / "kubepods" / "besteffort" / f"pod{UID}"
    (pod_dir / CID).mkdir(parents=True)
    return pod_dir


@pytest.mark.parametrize(
    ("marker", "hierarchy"),
    [
        pytest.param("cgroup.controllers", "", id="pure-v2"),
        pytest.param("unified/cgroup.controllers", "unified", id="hybrid-v2-under-unified"),
        pytest.param("pids/cgroup.procs", None, id="v1-only-has-none"),
    ],
)
def test_v2_root(tmp_path: Path, marker: str, hierarchy: str | None) -> None:
    """The v2 hierarchy is the root itself, or its `unified` directory on a hybrid host, or none."""
    (tmp_path / marker).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / marker).write_text("")
    tree = CgroupfsTree(str(tmp_path))
    assert tree.root == str(tmp_path)
    assert tree.v2_root() == (None if hierarchy is None else str(tmp_path / hierarchy).rstrip("/"))


def test_locate_finds_the_pods_and_containers_cgroups(tmp_path: Path) -> None:
    """The kubelet's directories of the pods asked for, by (pod UID, container ID or None)."""
    pod_dir = _kubelet_tree(tmp_path)
    tree = CgroupfsTree(str(tmp_path))
    assert tree.locate(str(tmp_path), [UID]) == {(UID, None): str(pod_dir), (UID, CID): str(pod_dir / CID)}
    assert tree.locate(str(tmp_path), ["ffffffff-0000-4000-8000-000000000000"]) == {}


def test_exists(tmp_path: Path) -> None:
    """A cgroup directory exists until it is removed."""
    pod_dir = _kubelet_tree(tmp_path)
    tree = CgroupfsTree(str(tmp_path))
    assert tree.exists(str(pod_dir / CID))
    (pod_dir / CID).rmdir()
    assert not tree.exists(str(pod_dir / CID))


def test_sibling_container_ids_are_the_container_leaves_next_to_it(tmp_path: Path) -> None:
    """Directories named as a runtime's container leaf count, itself included; conmon's, files and others do not."""
    pod_dir = _kubelet_tree(tmp_path)
    (pod_dir / f"cri-containerd-{OTHER}.scope").mkdir()
    (pod_dir / f"crio-conmon-{'c' * 64}.scope").mkdir()
    (pod_dir / "not-a-container").mkdir()
    (pod_dir / ("d" * 64)).write_text("")  # a file, not a cgroup
    tree = CgroupfsTree(str(tmp_path))
    assert tree.sibling_container_ids(str(pod_dir / CID)) == {CID, OTHER}
    assert tree.sibling_container_ids(str(tmp_path / "gone" / CID)) == set()


@pytest.mark.parametrize(
    ("events", "populated"),
    [
        pytest.param("populated 1\nfrozen 0\n", True, id="a-process-runs-in-it"),
        pytest.param("populated 0\nfrozen 0\n", False, id="empty"),
        pytest.param(None, False, id="no-cgroup-events-a-removed-cgroup"),
    ],
)
def test_populated_reads_cgroup_events(tmp_path: Path, events: str | None, populated: bool) -> None:
    """cgroup.events says whether any process runs in the cgroup or below; an unreadable one says no."""
    pod_dir = _kubelet_tree(tmp_path)
    if events is not None:
        (pod_dir / CID / "cgroup.events").write_text(events)
    assert CgroupfsTree(str(tmp_path)).populated(str(pod_dir / CID)) is populated
