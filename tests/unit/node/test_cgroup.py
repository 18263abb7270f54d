"""parse_cgroup against golden /proc/<pid>/cgroup files, one per layout the kubelet and runtimes produce; the
killer's directory of a container (find_container_cgroup) and its processes (read_members) over fake cgroup trees."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from vramguard.core.model import CgroupIdentity
from vramguard.node.cgroup import ContainerCgroup, find_container_cgroup, parse_cgroup, parse_cgroup_path, read_members

FIXTURES = Path(__file__).parents[2] / "fixtures" / "cgroup"

UID = "8f2a6c1e-3b4d-4e5f-9a0b-1c2d3e4f5a6b"
CID = "3f1c9a7e5b2d4f6081a3c5e7092b4d6f8a1c3e5071b9d2f4a6c8e0123456789a"
SANDBOX_ID = "c0ffee00" * 8
STATIC_UID = "6a3b1f0e9d8c7b6a5f4e3d2c1b0a9f8e"


def ident(qos: str | None, runtime: str | None, container_id: str | None = CID, uid: str = UID) -> CgroupIdentity:
    return CgroupIdentity(pod_uid=uid, container_id=container_id, runtime=runtime, qos=qos)


# Each case is a file tests/fixtures/cgroup/<id>.txt; the id states the layout, the value what it must parse to.
GOLDEN = [
    pytest.param(ident("guaranteed", None), id="cgroup-v1-cgroupfs-guaranteed-docker"),
    pytest.param(ident("burstable", None), id="cgroup-v1-cgroupfs-burstable-containerd"),
    pytest.param(ident("besteffort", "crio"), id="cgroup-v1-cgroupfs-besteffort-crio"),
    pytest.param(ident("burstable", "docker"), id="cgroup-v1-systemd-burstable-docker"),
    pytest.param(ident("guaranteed", "containerd"), id="cgroup-v1-systemd-guaranteed-containerd"),
    pytest.param(ident("besteffort", "crio"), id="cgroup-v1-systemd-besteffort-crio"),
    pytest.param(ident("burstable", "containerd"), id="cgroup-v2-systemd-burstable-containerd"),
    pytest.param(ident("guaranteed", "crio"), id="cgroup-v2-systemd-guaranteed-crio"),
    pytest.param(ident("besteffort", "docker"), id="cgroup-v2-systemd-besteffort-docker"),
    pytest.param(ident("burstable", "crio"), id="cgroup-v2-systemd-crio-container-subcgroup"),
    pytest.param(ident("besteffort", "crio"), id="cgroup-v2-cgroupfs-besteffort-crio"),
    pytest.param(ident("guaranteed", None), id="cgroup-v2-cgroupfs-guaranteed-containerd"),
    pytest.param(ident("burstable", None), id="cgroup-v2-cgroupfs-burstable-docker"),
    pytest.param(ident("burstable", "containerd"), id="hybrid-v2-unified-names-pod-v1-root"),
    pytest.param(ident("burstable", None), id="hybrid-only-one-v1-controller-names-pod"),
    pytest.param(ident("burstable", None), id="hybrid-v1-pod-cgroup-v2-container"),
    pytest.param(ident("besteffort", "containerd"), id="kind-v2-systemd-besteffort-containerd"),
    pytest.param(ident("guaranteed", "containerd"), id="kind-v2-systemd-guaranteed-containerd"),
    pytest.param(ident("burstable", None), id="kind-v1-cgroupfs-burstable-containerd"),
    pytest.param(ident("besteffort", "containerd"), id="private-namespace-v2-systemd-besteffort"),
    pytest.param(ident("burstable", "containerd"), id="private-namespace-v2-systemd-other-qos"),
    pytest.param(ident("burstable", None), id="private-namespace-v2-cgroupfs-burstable"),
    # The namespace hid the QoS directory; the pod and container are still certain.
    pytest.param(ident(None, None), id="private-namespace-v2-cgroupfs-guaranteed"),
    # conmon lives in the pod's cgroup but is runtime plumbing: never attributed, so never a kill candidate.
    pytest.param(None, id="conmon-v2-systemd-crio"),
    pytest.param(None, id="conmon-v1-cgroupfs-crio"),
    pytest.param(ident("burstable", None, container_id=None), id="pod-cgroup-v2-systemd"),
    pytest.param(ident("guaranteed", None, container_id=None), id="pod-cgroup-v1-cgroupfs"),
    # The sandbox leaf looks like any container; attribution filters it (its ID is in no container status).
    pytest.param(ident("besteffort", "containerd", container_id=SANDBOX_ID), id="pause-sandbox-v2-systemd-containerd"),
    pytest.param(ident("burstable", None, uid=STATIC_UID), id="static-pod-v1-cgroupfs"),
    pytest.param(ident("burstable", None), id="nested-cgroup-inside-container"),
    pytest.param(None, id="host-process-v2-system-service"),
    pytest.param(None, id="host-process-v1-user-session"),
    pytest.param(None, id="host-process-root"),
    pytest.param(None, id="kubelet-itself"),
    pytest.param(None, id="garbage-empty"),
    pytest.param(None, id="garbage-no-colons"),
    pytest.param(None, id="garbage-bad-uid"),
    pytest.param(None, id="garbage-short-container-id"),
    pytest.param(None, id="garbage-pod-dir-outside-kubepods"),
    pytest.param(None, id="garbage-unicode-and-control-chars"),
    pytest.param(None, id="garbage-truncated-line"),
]


@pytest.mark.parametrize("expected", GOLDEN)
def test_golden(request: pytest.FixtureRequest, expected: CgroupIdentity | None) -> None:
    """Each real-looking /proc/<pid>/cgroup file parses to the pod, container, runtime and QoS it names."""
    case = request.node.callspec.id
    text = (FIXTURES / f"{case}.txt").read_text(encoding="utf-8")
    assert parse_cgroup(text) == expected


def test_every_fixture_has_an_expectation() -> None:
    """No golden file sits in the fixture directory without a row in the table (and vice versa)."""
    files = {p.stem for p in FIXTURES.glob("*.txt")}
    rows = {p.id for p in GOLDEN}
    assert files == rows


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param(f"/kubepods/burstable/pod{UID}/{CID}", ident("burstable", None), id="path-cgroupfs-burstable"),
        pytest.param(
            f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
            ident("guaranteed", "containerd"),
            id="path-systemd-guaranteed",
        ),
        pytest.param(f"/kubepods/burstable/pod{UID}/crio-conmon-{CID}", None, id="path-conmon"),
        pytest.param(f"/kubepods/burstable/pod{UID}", ident("burstable", None, None), id="path-pod-cgroup"),
        pytest.param(f"/kubepods/burstable/pod{UID}/", ident("burstable", None, None), id="path-trailing-slash"),
        pytest.param(f"/burstable/pod{UID}/{CID}", None, id="path-qos-dir-not-under-kubepods"),
        pytest.param(f"/kubepods/burstable/pod{UID}/{CID.upper()}", None, id="path-uppercase-id-rejected"),
        pytest.param("/", None, id="path-root"),
    ],
)
def test_parse_cgroup_path(path: str, expected: CgroupIdentity | None) -> None:
    """A single cgroup path is classified exactly as a whole file with that path would be."""
    assert parse_cgroup_path(path) == expected
    assert parse_cgroup(f"0::{path}\n") == expected


def test_container_line_wins_over_pod_line_in_any_order() -> None:
    """When one line names only the pod and another the container, the container is reported."""
    pod_line = f"7:pids:/kubepods/burstable/pod{UID}"
    container_line = f"0::/kubepods/burstable/pod{UID}/{CID}"
    for text in (f"{pod_line}\n{container_line}\n", f"{container_line}\n{pod_line}\n"):
        assert parse_cgroup(text) == ident("burstable", None)


def test_mutated_inputs_never_raise() -> None:
    """Random truncations and byte flips of every golden file give an identity or None, never an exception."""
    rng = random.Random(20240611)
    alphabet = "/:-_.0123456789abcdefpodkubeslice\n\x00é"
    texts = [p.read_text(encoding="utf-8") for p in sorted(FIXTURES.glob("*.txt"))]
    checked = 0
    for text in texts:
        for _ in range(200):
            chars = list(text[: rng.randrange(len(text) + 1)])
            for _ in range(rng.randrange(4)):
                if chars:
                    chars[rng.randrange(len(chars))] = rng.choice(alphabet)
            result = parse_cgroup("".join(chars))
            assert result is None or isinstance(result, CgroupIdentity)
            checked += 1
    assert checked == 200 * len(texts)


# --------------------------------------------------------------------------------------------------------------
# A violating container's directory, which a kill may trust

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
        assert found == ContainerCgroup(CID, str(tmp_path / expected), v2)


def test_members_include_sub_cgroups(tmp_path: Path) -> None:
    """A container's processes are its own cgroup's and every sub-cgroup's below it."""
    fake_tree(tmp_path, {REAL: [10, 11], f"{REAL}/a": [12], f"{REAL}/a/b": [13]})
    assert sorted(read_members(str(tmp_path / REAL))) == [10, 11, 12, 13]


def test_a_container_gone_has_no_members(tmp_path: Path) -> None:
    """A directory removed with its container lists no process (it is not an error to report)."""
    assert read_members(str(tmp_path / "gone")) == []
