"""parse_cgroup against golden /proc/<pid>/cgroup files, one per layout the kubelet and runtimes produce, read where
this node's kubelet makes pod cgroups (its --cgroup-root, the agent's cgroup namespace); the look-alikes of them
elsewhere; the killer's directory of a container (find_container_cgroup) and its processes (read_members) over fake
cgroup trees."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from vramguard.core.process import LOOK_ALIKE, CgroupIdentity, LookAlike
from vramguard.node.cgroup import (
    HOST_KUBELET,
    ContainerCgroup,
    KubeletTree,
    Level,
    find_container_cgroup,
    find_namespace,
    kubelet_cgroup,
    kubelet_root,
    parse_cgroup,
    place_cgroup,
    pod_cgroups,
    read_members,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "cgroup"

UID = "8f2a6c1e-3b4d-4e5f-9a0b-1c2d3e4f5a6b"
CID = "3f1c9a7e5b2d4f6081a3c5e7092b4d6f8a1c3e5071b9d2f4a6c8e0123456789a"
SANDBOX_ID = "c0ffee00" * 8
STATIC_UID = "6a3b1f0e9d8c7b6a5f4e3d2c1b0a9f8e"
AGENT_UID = "0a9b8c7d-6e5f-4a3b-9c1d-0e1f2a3b4c5d"
AGENT_CID = "ef" * 32

# kind's kubelet (--cgroup-root=/kubelet); an agent in a pod with its own cgroup namespace, a BestEffort pod of the
# host's kubelet under each driver, as the host's hierarchy names its container (what `find_namespace` finds).
KIND = KubeletTree(root=("kubelet",))
IN_POD_CGROUPFS = KubeletTree(namespace=(("0", ("kubepods", "besteffort", f"pod{AGENT_UID}", AGENT_CID)),))
IN_POD_SYSTEMD = KubeletTree(
    namespace=(
        (
            "0",
            (
                "kubepods.slice",
                "kubepods-besteffort.slice",
                f"kubepods-besteffort-pod{AGENT_UID.replace('-', '_')}.slice",
                f"cri-containerd-{AGENT_CID}.scope",
            ),
        ),
    )
)
UNPLACED = KubeletTree(namespace=(("0", None),))  # a private namespace the agent could not find on the mount


def ident(qos: str | None, runtime: str | None, container_id: str | None = CID, uid: str = UID) -> CgroupIdentity:
    return CgroupIdentity(pod_uid=uid, container_id=container_id, runtime=runtime, qos=qos)


def golden(
    fixture: str, expected: CgroupIdentity | LookAlike | None, kubelet: KubeletTree = HOST_KUBELET
) -> Any:  # a pytest.param
    """A row: tests/fixtures/cgroup/<fixture>.txt read with `kubelet` places the process at `expected`."""
    return pytest.param(fixture, kubelet, expected, id=fixture)


# Each row reads a file tests/fixtures/cgroup/<fixture>.txt; the id states the layout or the rule.
GOLDEN = [
    golden("cgroup-v1-cgroupfs-guaranteed-docker", ident("guaranteed", None)),
    golden("cgroup-v1-cgroupfs-burstable-containerd", ident("burstable", None)),
    golden("cgroup-v1-cgroupfs-besteffort-crio", ident("besteffort", "crio")),
    golden("cgroup-v1-systemd-burstable-docker", ident("burstable", "docker")),
    golden("cgroup-v1-systemd-guaranteed-containerd", ident("guaranteed", "containerd")),
    golden("cgroup-v1-systemd-besteffort-crio", ident("besteffort", "crio")),
    golden("cgroup-v2-systemd-burstable-containerd", ident("burstable", "containerd")),
    golden("cgroup-v2-systemd-guaranteed-crio", ident("guaranteed", "crio")),
    golden("cgroup-v2-systemd-besteffort-docker", ident("besteffort", "docker")),
    golden("cgroup-v2-systemd-crio-container-subcgroup", ident("burstable", "crio")),
    golden("cgroup-v2-cgroupfs-besteffort-crio", ident("besteffort", "crio")),
    golden("cgroup-v2-cgroupfs-guaranteed-containerd", ident("guaranteed", None)),
    golden("cgroup-v2-cgroupfs-burstable-docker", ident("burstable", None)),
    golden("hybrid-v2-unified-names-pod-v1-root", ident("burstable", "containerd")),
    golden("hybrid-only-one-v1-controller-names-pod", ident("burstable", None)),
    golden("hybrid-v1-pod-cgroup-v2-container", ident("burstable", None)),
    # kind's kubelet (--cgroup-root=/kubelet) nests its tree under kubelet.slice or kubelet.
    golden("kind-v2-systemd-besteffort-containerd", ident("besteffort", "containerd"), KIND),
    golden("kind-v2-systemd-guaranteed-containerd", ident("guaranteed", "containerd"), KIND),
    golden("kind-v1-cgroupfs-burstable-containerd", ident("burstable", None), KIND),
    # Read through the agent's own cgroup namespace: the ".." climb from where the agent's namespace is rooted.
    golden("private-namespace-v2-systemd-besteffort", ident("besteffort", "containerd"), IN_POD_SYSTEMD),
    golden("private-namespace-v2-systemd-other-qos", ident("burstable", "containerd"), IN_POD_SYSTEMD),
    golden("private-namespace-v2-cgroupfs-burstable", ident("burstable", None), IN_POD_CGROUPFS),
    golden("private-namespace-v2-cgroupfs-guaranteed", ident("guaranteed", None), IN_POD_CGROUPFS),
    # conmon lives in the pod's cgroup but is runtime plumbing: never attributed, so never a kill candidate.
    golden("conmon-v2-systemd-crio", None),
    golden("conmon-v1-cgroupfs-crio", None),
    golden("pod-cgroup-v2-systemd", ident("burstable", None, container_id=None)),
    golden("pod-cgroup-v1-cgroupfs", ident("guaranteed", None, container_id=None)),
    # The sandbox leaf looks like any container; attribution filters it (its ID is in no container status).
    golden("pause-sandbox-v2-systemd-containerd", ident("besteffort", "containerd", container_id=SANDBOX_ID)),
    golden("static-pod-v1-cgroupfs", ident("burstable", None, uid=STATIC_UID)),
    golden("nested-cgroup-inside-container", ident("burstable", None)),
    golden("host-process-v2-system-service", None),
    golden("host-process-v1-user-session", None),
    golden("host-process-root", None),
    golden("kubelet-itself", None),
    golden("garbage-empty", None),
    golden("garbage-no-colons", None),
    golden("garbage-bad-uid", None),
    golden("garbage-short-container-id", None),
    golden("garbage-unicode-and-control-chars", None),
    golden("garbage-truncated-line", None),
    # A pod's shape anywhere but below this kubelet's root is a look-alike: another kubelet's, or anyone's mkdir.
    golden("look-alike-v2-rootless-systemd-user-slice", LOOK_ALIKE),
    golden("look-alike-v2-rootless-k3s-cgroupfs", LOOK_ALIKE),
    golden("look-alike-v2-nested-node-docker-cgroupfs", LOOK_ALIKE),
    golden("look-alike-v2-nested-kind-node-docker-scope", LOOK_ALIKE),
    golden("look-alike-v2-pod-dir-under-user-slice", LOOK_ALIKE),
    golden("look-alike-v1-hybrid-user-slice-cgroupfs", LOOK_ALIKE),
]

# The same files read where they are not this kubelet's.
ELSEWHERE = [
    pytest.param("kind-v2-systemd-besteffort-containerd", HOST_KUBELET, id="kind-tree-to-a-kubelet-rooted-at-slash"),
    pytest.param("kind-v1-cgroupfs-burstable-containerd", HOST_KUBELET, id="kind-cgroupfs-tree-to-a-kubelet-at-slash"),
    pytest.param("cgroup-v2-systemd-burstable-containerd", KIND, id="host-tree-to-kinds-kubelet"),
    pytest.param("cgroup-v1-cgroupfs-burstable-containerd", KIND, id="host-cgroupfs-tree-to-kinds-kubelet"),
    pytest.param("private-namespace-v2-systemd-besteffort", HOST_KUBELET, id="dotdot-read-as-if-in-host-namespace"),
    pytest.param("private-namespace-v2-cgroupfs-burstable", UNPLACED, id="dotdot-through-an-unplaced-namespace"),
    pytest.param("private-namespace-v2-cgroupfs-burstable", IN_POD_SYSTEMD, id="dotdot-climbing-into-another-layout"),
]


@pytest.mark.parametrize(("fixture", "kubelet", "expected"), GOLDEN)
def test_golden(fixture: str, kubelet: KubeletTree, expected: CgroupIdentity | LookAlike | None) -> None:
    """Each real-looking /proc/<pid>/cgroup file places its process in the pod, container, runtime and QoS it
    names below this kubelet's root, as a look-alike elsewhere, or nowhere; only the kubelet's is a pod's."""
    text = (FIXTURES / f"{fixture}.txt").read_text(encoding="utf-8")
    assert place_cgroup(text, kubelet) == expected
    assert parse_cgroup(text, kubelet) == (expected if isinstance(expected, CgroupIdentity) else None)


@pytest.mark.parametrize(("fixture", "kubelet"), ELSEWHERE)
def test_a_kubelet_pod_cgroup_elsewhere_is_a_look_alike(fixture: str, kubelet: KubeletTree) -> None:
    """A genuine pod path of one kubelet, read for another kubelet's root or through the wrong namespace, is no
    pod's: a look-alike, whatever UID and container ID it names."""
    text = (FIXTURES / f"{fixture}.txt").read_text(encoding="utf-8")
    assert place_cgroup(text, kubelet) is LOOK_ALIKE
    assert parse_cgroup(text, kubelet) is None


def test_every_fixture_has_an_expectation() -> None:
    """No golden file sits in the fixture directory without a row in the table (and vice versa)."""
    files = {p.stem for p in FIXTURES.glob("*.txt")}
    rows = {p.values[0] for p in GOLDEN}
    assert files == rows


@pytest.mark.parametrize(
    ("path", "kubelet", "expected"),
    [
        pytest.param(f"/kubepods/burstable/pod{UID}/{CID}", HOST_KUBELET, ident("burstable", None), id="path-cgroupfs"),
        pytest.param(
            f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
            HOST_KUBELET,
            ident("guaranteed", "containerd"),
            id="path-systemd-guaranteed",
        ),
        pytest.param(
            f"/a.slice/a-b_c.slice/a-b_c-kubepods.slice/a-b_c-kubepods-besteffort.slice/"
            f"a-b_c-kubepods-besteffort-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
            KubeletTree(root=("a", "b-c")),
            ident("besteffort", "crio"),
            id="path-systemd-two-level-root-with-a-dash",
        ),
        pytest.param(
            f"/a/b-c/kubepods/pod{UID}/{CID}",
            KubeletTree(root=("a", "b-c")),
            ident("guaranteed", None),
            id="path-cgroupfs-two-level-root",
        ),
        pytest.param(f"/kubepods/burstable/pod{UID}/crio-conmon-{CID}", HOST_KUBELET, None, id="path-conmon"),
        pytest.param(
            f"/kubepods/burstable/pod{UID}", HOST_KUBELET, ident("burstable", None, None), id="path-pod-cgroup"
        ),
        pytest.param(
            f"/kubepods/burstable/pod{UID}/", HOST_KUBELET, ident("burstable", None, None), id="path-trailing-slash"
        ),
        pytest.param(f"/burstable/pod{UID}/{CID}", HOST_KUBELET, None, id="path-qos-dir-not-under-kubepods"),
        pytest.param(
            f"/kubepods/burstable/pod{UID}/{CID.upper()}", HOST_KUBELET, None, id="path-uppercase-id-rejected"
        ),
        pytest.param(f"/kubepods/burstable/besteffort/pod{UID}/{CID}", HOST_KUBELET, None, id="path-two-qos-levels"),
        pytest.param(
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/{CID}",
            HOST_KUBELET,
            None,
            id="path-systemd-pod-of-another-qos-slice",
        ),
        pytest.param(f"/kubepods//burstable/pod{UID}/{CID}", HOST_KUBELET, None, id="path-empty-segment"),
        pytest.param(f"/kubepods/burstable/../burstable/pod{UID}/{CID}", HOST_KUBELET, None, id="path-dotdot-inside"),
        pytest.param(
            f"/../../../../../kubepods/pod{UID}/{CID}", IN_POD_CGROUPFS, None, id="path-climbs-above-the-root"
        ),
        pytest.param(
            f"/../../../../user.slice/kubepods/pod{UID}/{CID}", IN_POD_CGROUPFS, None, id="path-climbs-to-a-user-slice"
        ),
        pytest.param(
            "/", IN_POD_CGROUPFS, ident("besteffort", None, AGENT_CID, AGENT_UID), id="path-own-namespace-root"
        ),
        pytest.param("/", HOST_KUBELET, None, id="path-root"),
    ],
)
def test_one_path(path: str, kubelet: KubeletTree, expected: CgroupIdentity | None) -> None:
    """One v2 path is a kubelet's pod or container only in the kubelet's exact layout below its root, placed from
    the agent's namespace root."""
    assert parse_cgroup(f"0::{path}\n", kubelet) == expected


def test_container_line_wins_over_pod_line_in_any_order() -> None:
    """When one line names only the pod and another the container, the container is reported."""
    pod_line = f"7:pids:/kubepods/burstable/pod{UID}"
    container_line = f"0::/kubepods/burstable/pod{UID}/{CID}"
    for text in (f"{pod_line}\n{container_line}\n", f"{container_line}\n{pod_line}\n"):
        assert parse_cgroup(text) == ident("burstable", None)


def test_a_kubelet_line_wins_over_a_look_alike_line() -> None:
    """A hybrid host's process in this kubelet's pod in one hierarchy and in a look-alike in another is the pod's."""
    look_alike = f"7:pids:/user.slice/kubepods/burstable/pod{STATIC_UID}/{'cd' * 32}"
    genuine = f"0::/kubepods/burstable/pod{UID}/{CID}"
    for text in (f"{look_alike}\n{genuine}\n", f"{genuine}\n{look_alike}\n"):
        assert place_cgroup(text) == ident("burstable", None)


def test_each_hierarchy_is_placed_from_its_own_namespace_root() -> None:
    """A hybrid host's agent in a private namespace in v2 only reads v1's paths as they are: a v1 path is never
    climbed from v2's root."""
    kubelet = KubeletTree(namespace=(("0", ("kubepods", "besteffort", f"pod{AGENT_UID}", AGENT_CID)),))
    v1 = f"7:pids:/kubepods/burstable/pod{UID}/{CID}\n0::/../../../burstable/pod{STATIC_UID}/{CID}\n"
    assert parse_cgroup(v1, kubelet) == ident("burstable", None)
    assert parse_cgroup("7:pids:/\n4:memory:/process_api/x\n", kubelet) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("/", (), id="kubelet-default-root"),
        pytest.param("/kubelet", ("kubelet",), id="kind-root"),
        pytest.param("/kubelet/", ("kubelet",), id="trailing-slash"),
        pytest.param("/kubelet.slice", ("kubelet",), id="kind-root-in-systemd-form"),
        pytest.param("/a.slice/a-b_c.slice", ("a", "b-c"), id="two-level-systemd-form-unescaped"),
        pytest.param("/a/b-c", ("a", "b-c"), id="two-level-cgroupfs-form"),
        pytest.param("/system.slice/k3s.service", ("system.slice", "k3s.service"), id="mixed-names-read-as-cgroupfs"),
    ],
)
def test_kubelet_root(value: str, expected: tuple[str, ...]) -> None:
    """The kubelet's --cgroup-root is read as the kubelet reads it, its systemd form giving the same parts."""
    assert kubelet_root(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("", "not an absolute cgroup path", id="empty"),
        pytest.param("kubelet", "not an absolute cgroup path", id="relative"),
        pytest.param("/a/../b", "'..' where a cgroup name goes", id="dotdot"),
        pytest.param("/a//b", "'' where a cgroup name goes", id="empty-segment"),
        pytest.param("/a b", "'a b' where a cgroup name goes", id="space"),
        pytest.param("/a.slice/b.slice", "not a systemd slice path (that would be /b.slice)", id="slices-not-nested"),
        pytest.param("/kubepods", "names the kubelet's pods directory", id="the-pods-directory-itself"),
        pytest.param("/kubepods.slice", "names the kubelet's pods directory", id="the-pods-slice-itself"),
    ],
)
def test_kubelet_root_refused(value: str, message: str) -> None:
    """A value that cannot be a kubelet's --cgroup-root is refused, saying why."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        kubelet_root(value)


@pytest.mark.parametrize(
    ("segments", "root", "expected"),
    [
        pytest.param((), (), Level.ABOVE_PODS, id="hierarchy-root-is-above-the-pods"),
        pytest.param(("kubepods",), (), Level.ABOVE_PODS, id="kubepods"),
        pytest.param(("kubepods", "burstable"), (), Level.ABOVE_PODS, id="qos-directory"),
        pytest.param(("kubepods.slice", "kubepods-besteffort.slice"), (), Level.ABOVE_PODS, id="qos-slice"),
        pytest.param(("kubelet",), ("kubelet",), Level.ABOVE_PODS, id="kind-root-directory"),
        pytest.param(("kubelet.slice",), ("kubelet",), Level.ABOVE_PODS, id="kind-root-slice"),
        pytest.param(("kubelet",), (), Level.OUTSIDE, id="kind-directory-to-a-root-at-slash"),
        pytest.param(("kubepods",), ("kubelet",), Level.OUTSIDE, id="host-kubepods-to-kinds-kubelet"),
        pytest.param(("user.slice",), (), Level.OUTSIDE, id="user-slice"),
        pytest.param(("kubepods", "burstable", f"pod{UID}", "sub"), (), Level.NOT_WORKLOAD, id="unknown-leaf"),
    ],
)
def test_kubelet_cgroup_levels(segments: tuple[str, ...], root: tuple[str, ...], expected: Level) -> None:
    """Directories that are no pod's are told apart: the kubelet's own (walked), runtime plumbing, and the rest."""
    assert kubelet_cgroup(segments, root) is expected


def test_mutated_inputs_never_raise() -> None:
    """Random truncations and byte flips of every golden file give an identity, a look-alike or None, never an
    exception, read from the host's namespace or a pod's."""
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
            for kubelet in (HOST_KUBELET, IN_POD_SYSTEMD):
                result = place_cgroup("".join(chars), kubelet)
                assert result is None or result is LOOK_ALIKE or isinstance(result, CgroupIdentity)
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


AGENT = ("kubepods", "besteffort", f"pod{AGENT_UID}", AGENT_CID)  # the agent's own container, its namespace root
KIND_AGENT = ("kubelet", *AGENT)
LOOK_ALIKE_DIR = f"user.slice/user-1000.slice/user@1000.service/kubepods/burstable/pod{UID}/{CID}"
NESTED_DIR = f"docker/{'ab' * 32}/kubepods/burstable/pod{UID}/{CID}"


def find(
    text: str,
    layout: dict[str, list[int]],
    expected: str | None,
    *,
    kubelet: KubeletTree = HOST_KUBELET,
    v2_mounts: Sequence[str] = ("",),
    freezer: bool = False,
    v2: bool = True,
    id: str,
) -> Any:  # a pytest.param
    """A row: `text` read with `kubelet` over the directories of `layout` finds the container's at `expected`."""
    return pytest.param(text, layout, v2_mounts, freezer, kubelet, expected, v2, id=id)


FIND_CASES = [
    find(f"0::/{REAL}\n", {REAL: [PID]}, REAL, id="v2-host-namespace"),
    find(f"0::/{REAL}\n", {REAL: [1, 2]}, None, id="v2-path-not-listing-the-pid"),
    find(f"0::/{REAL}\n", {f"unified/{REAL}": [PID]}, f"unified/{REAL}", v2_mounts=("unified",), id="hybrid-unified"),
    find(f"0::/{REAL}/sub\n", {REAL: [], f"{REAL}/sub": [PID]}, REAL, id="process-in-a-sub-cgroup-gives-the-container"),
    find(
        f"0::/../../../burstable/pod{UID}/{CID}\n",
        {REAL: [PID]},
        REAL,
        kubelet=KubeletTree(namespace=(("0", AGENT),)),
        id="private-namespace-placed-from-the-agents-root",
    ),
    find(
        f"0::/../../../burstable/pod{UID}/{CID}\n",
        {REAL: [PID], f"kubelet/{REAL}": [PID]},
        f"kubelet/{REAL}",
        kubelet=KubeletTree(root=("kubelet",), namespace=(("0", KIND_AGENT),)),
        id="private-namespace-in-kind-never-takes-the-hosts-tree",
    ),
    find(
        f"0::/../../../burstable/pod{UID}/{CID}\n",
        {REAL: [1]},
        None,
        kubelet=KubeletTree(namespace=(("0", AGENT),)),
        id="private-namespace-directory-not-listing-the-pid",
    ),
    find(
        f"0::/../../../burstable/pod{UID}/{CID}\n",
        {REAL: [PID]},
        None,
        kubelet=KubeletTree(namespace=(("0", None),)),
        id="private-namespace-never-placed-finds-nothing",
    ),
    find(
        f"0::/../burstable/pod{UID}/{CID}\n",
        {f"a/b/c/d/e/burstable/pod{UID}/{CID}": [PID]},
        None,
        kubelet=KubeletTree(namespace=(("0", ("a", "b", "c", "d", "e", "f")),)),
        id="private-namespace-outside-the-kubelets-directories",
    ),
    find(f"0::/{LOOK_ALIKE_DIR}\n", {LOOK_ALIKE_DIR: [PID], REAL: []}, None, id="look-alike-in-a-user-slice"),
    find(f"0::/{NESTED_DIR}\n", {NESTED_DIR: [PID], REAL: []}, None, id="look-alike-of-a-nested-node"),
    find(f"0::/kubelet/{REAL}\n", {f"kubelet/{REAL}": [PID]}, None, id="kind-tree-to-a-kubelet-rooted-at-slash"),
    find(
        f"6:freezer:/{REAL}\n0::/\n",
        {f"freezer/{REAL}": [PID]},
        f"freezer/{REAL}",
        v2_mounts=(),
        freezer=True,
        v2=False,
        id="v1-freezer",
    ),
    find(
        f"6:freezer:/{REAL}\n0::/{REAL}\n",
        {REAL: [PID], f"freezer/{REAL}": [PID]},
        REAL,
        freezer=True,
        id="v2-preferred-over-v1",
    ),
    find("6:freezer:/\n0::/\n", {"": [PID]}, None, freezer=True, id="root-is-never-a-container"),
    find(
        f"0::/kubepods/burstable/pod{UID}/{OTHER_CID}\n",
        {f"kubepods/burstable/pod{UID}/{OTHER_CID}": [PID]},
        None,
        id="another-container-of-the-pod",
    ),
    find(f"0::/kubepods/burstable/pod{UID}\n", {f"kubepods/burstable/pod{UID}": [PID]}, None, id="pod-cgroup-itself"),
]


@pytest.mark.parametrize(("text", "layout", "v2_mounts", "freezer", "kubelet", "expected", "v2"), FIND_CASES)
def test_find_container_cgroup(
    tmp_path: Path,
    text: str,
    layout: dict[str, list[int]],
    v2_mounts: Sequence[str],
    freezer: bool,
    kubelet: KubeletTree,
    expected: str | None,
    v2: bool,
) -> None:
    """Only a directory of a violating container in the kubelet's tree, listing the process, is accepted."""
    fake_tree(tmp_path, layout, v2_mounts, freezer)
    found = find_container_cgroup(text, PID, UID, frozenset({CID}), str(tmp_path), kubelet)
    if expected is None:
        assert found is None
    else:
        assert found == ContainerCgroup(CID, str(tmp_path / expected), v2)


@pytest.mark.parametrize(
    ("kubelet", "expected"),
    [
        pytest.param(HOST_KUBELET, [f"kubepods/burstable/pod{UID}", REAL], id="kubelet-at-slash-walks-kubepods-only"),
        pytest.param(
            KubeletTree(root=("kubelet",)),
            [f"kubelet/kubepods/burstable/pod{UID}", f"kubelet/{REAL}"],
            id="kinds-kubelet-walks-its-own-tree-only",
        ),
    ],
)
def test_walk_enters_the_kubelets_tree_only(tmp_path: Path, kubelet: KubeletTree, expected: list[str]) -> None:
    """The pod directories a walk finds (driver limits, the cgroup watcher) are the kubelet's own: look-alikes under
    a user slice, a nested node or another kubelet's root are never yielded."""
    fake_tree(tmp_path, {REAL: [], f"kubelet/{REAL}": [], LOOK_ALIKE_DIR: [], NESTED_DIR: []})
    found = [str(Path(d).relative_to(tmp_path)) for _, d in pod_cgroups(str(tmp_path), [UID], kubelet)]
    assert found == expected


SELF = 777  # the agent's PID in the fake /proc


@pytest.mark.parametrize(
    ("init", "own", "layout", "expected"),
    [
        pytest.param("0::/init.scope\n", "0::/\n", {}, (), id="host-namespace-nothing-to-place"),
        pytest.param(
            "0::/../../../../init.scope\n",
            "0::/\n",
            {"/".join(AGENT): [SELF], f"kubepods/besteffort/pod{AGENT_UID}/{'00' * 32}": [1]},
            (("0", AGENT),),
            id="private-v2-the-directory-that-deep-listing-the-agent",
        ),
        pytest.param(
            "0::/../../../..\n",
            "0::/sub\n",
            {"/".join(AGENT): [], "/".join((*AGENT, "sub")): [SELF]},
            (("0", AGENT),),
            id="init-at-the-root-and-the-agent-in-a-sub-cgroup",
        ),
        pytest.param(
            "0::/../../../../init.scope\n",
            "0::/\n",
            {"/".join(AGENT): [1]},
            (("0", None),),
            id="private-v2-no-directory-lists-the-agent",
        ),
        pytest.param(
            "4:memory:/../..\n0::/init.scope\n",
            "4:memory:/\n0::/\n",
            {"memory/process_api/x": [SELF]},
            (("4", ("process_api", "x")),),
            id="hybrid-each-hierarchy-its-own-root",
        ),
    ],
)
def test_find_namespace(
    tmp_path: Path,
    init: str,
    own: str,
    layout: dict[str, list[int]],
    expected: tuple[tuple[str, tuple[str, ...] | None], ...],
) -> None:
    """Where the agent's cgroup namespace is rooted: as deep as PID 1's path climbs, the directory listing the agent."""
    proc = tmp_path / "proc"
    for pid, text in ((1, init), (SELF, own)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    mount = tmp_path / "cgroup"
    fake_tree(mount, layout)
    (mount / "memory").mkdir(exist_ok=True)
    (mount / "memory" / "cgroup.procs").write_text("")
    assert find_namespace(str(proc), str(mount), SELF) == expected


def test_members_include_sub_cgroups(tmp_path: Path) -> None:
    """A container's processes are its own cgroup's and every sub-cgroup's below it."""
    fake_tree(tmp_path, {REAL: [10, 11], f"{REAL}/a": [12], f"{REAL}/a/b": [13]})
    assert sorted(read_members(str(tmp_path / REAL))) == [10, 11, 12, 13]


def test_a_container_gone_has_no_members(tmp_path: Path) -> None:
    """A directory removed with its container lists no process (it is not an error to report)."""
    assert read_members(str(tmp_path / "gone")) == []
