"""find_container_cgroup over fake cgroup trees: which directory a kill may trust."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from vramguard.node.kill import (
    ContainerCgroup as KillerCgroup,
)
from vramguard.node.kill import (
    find_container_cgroup,
)

UID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
CID = "ab" * 32
OTHER_CID = "cd" * 32
PID = 4242
REAL = f"kubepods/burstable/pod{UID}/{CID}"


def fake_tree(
    root: Path, layout: dict[str, list[int]], v2_mounts: Sequence[str] = ("",), freezer: bool = False
) -> None:
    """Directories under `root` with a cgroup.procs each (a mount's root gets cgroup.controllers or cgroup.procs)."""
    for mount in v2_mounts:
        (root / mount).mkdir(parents=True, exist_ok=True)
        (root / mount / "cgroup.controllers").write_text("")
    if freezer:
        (root / "freezer").mkdir(parents=True, exist_ok=True)
        (root / "freezer" / "cgroup.procs").write_text("")
    for directory, pids in layout.items():
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


FIND_CASES = [
    pytest.param(f"0::/{REAL}\n", {REAL: [PID]}, ("",), False, REAL, True, id="v2-host-namespace"),
    pytest.param(f"0::/{REAL}\n", {REAL: [1, 2]}, ("",), False, None, True, id="v2-path-not-listing-the-pid"),
    pytest.param(
        f"0::/{REAL}\n",
        {f"unified/{REAL}": [PID]},
        ("unified",),
        False,
        f"unified/{REAL}",
        True,
        id="hybrid-unified-mount",
    ),
    pytest.param(
        f"0::/{REAL}/sub\n",
        {REAL: [], f"{REAL}/sub": [PID]},
        ("",),
        False,
        REAL,
        True,
        id="process-in-a-sub-cgroup-gives-the-container",
    ),
    pytest.param(
        f"0::/../../../burstable/pod{UID}/{CID}\n",
        {f"kubepods/burstable/pod{UID}/{CID}": [1], f"kubelet/kubepods/burstable/pod{UID}/{CID}": [PID]},
        ("",),
        False,
        f"kubelet/kubepods/burstable/pod{UID}/{CID}",
        True,
        id="private-namespace-look-alike-tried-first-is-rejected",
    ),
    pytest.param(
        f"0::/../../../burstable/pod{UID}/{CID}\n",
        {f"kubepods/burstable/pod{UID}/{CID}": [1]},
        ("",),
        False,
        None,
        True,
        id="private-namespace-only-a-look-alike",
    ),
    pytest.param(
        f"0::/../burstable/pod{UID}/{CID}\n",
        {f"a/b/c/d/e/burstable/pod{UID}/{CID}": [PID]},
        ("",),
        False,
        None,
        True,
        id="private-namespace-outside-the-kubelets-directories",
    ),
    pytest.param(
        f"6:freezer:/{REAL}\n0::/\n", {f"freezer/{REAL}": [PID]}, (), True, f"freezer/{REAL}", False, id="v1-freezer"
    ),
    pytest.param(
        f"6:freezer:/{REAL}\n0::/{REAL}\n",
        {REAL: [PID], f"freezer/{REAL}": [PID]},
        ("",),
        True,
        REAL,
        True,
        id="v2-preferred-over-v1",
    ),
    pytest.param("6:freezer:/\n0::/\n", {"": [PID]}, ("",), True, None, True, id="root-is-never-a-container"),
    pytest.param(
        f"0::/kubepods/burstable/pod{UID}/{OTHER_CID}\n",
        {f"kubepods/burstable/pod{UID}/{OTHER_CID}": [PID]},
        ("",),
        False,
        None,
        True,
        id="another-container-of-the-pod",
    ),
    pytest.param(
        f"0::/kubepods/burstable/pod{UID}\n",
        {f"kubepods/burstable/pod{UID}": [PID]},
        ("",),
        False,
        None,
        True,
        id="pod-cgroup-itself",
    ),
]


@pytest.mark.parametrize(("text", "layout", "v2_mounts", "freezer", "expected", "v2"), FIND_CASES)
def test_find_container_cgroup(
    tmp_path: Path,
    text: str,
    layout: dict[str, list[int]],
    v2_mounts: Sequence[str],
    freezer: bool,
    expected: str | None,
    v2: bool,
) -> None:
    """Only a directory naming the violating container and listing the process is accepted."""
    fake_tree(tmp_path, layout, v2_mounts, freezer)
    found = find_container_cgroup(text, PID, UID, frozenset({CID}), str(tmp_path))
    if expected is None:
        assert found is None
    else:
        assert found == KillerCgroup(CID, str(tmp_path / expected), v2)
