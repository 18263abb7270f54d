"""The dmem limiter over a stand-in cgroup v2 tree of plain files (an amdgpu and a two-tile xe GPU registered), written
through a fake kernel that keeps the real one's write semantics: a dmem.max line replaces that region's value
only, and a max below the cgroup's usage is dropped without an error, as Linux 7.2 does. Also `probe_limits` over it,
as the limiter's worker asks at its start."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from vramguard.core.ports import LIMIT_MAX, DriverLimit, LimitFailed, LimitsUnavailable
from vramguard.core.quantity import GiB
from vramguard.node.cgroup_tree import CgroupfsTree
from vramguard.node.dmem import NO_CONTROLLER, DmemMemoryLimiter, parse_dmem
from vramguard.node.limiter import probe_limits

AMD = "0000:c1:00.0"  # amdgpu: one region, "vram"
XE = "0000:03:00.0"  # xe, two tiles: "vram0" and "vram1"
I915 = "0000:05:00.0"  # a DRM GPU whose driver registers no region
AMD_VRAM = f"drm/{AMD}/vram"
XE_VRAM0, XE_VRAM1 = f"drm/{XE}/vram0", f"drm/{XE}/vram1"
SLOTS = {0: AMD, 1: XE, 3: I915}  # GPU 2 is no DRM GPU
POD = "kubepods/burstable/pod0d7c2a8e-1f4b-4c1e-9a3d-5b6f7e8d9c0a"
CONTAINER = f"{POD}/{'ab' * 32}"
SUBTREE = "cpu memory pids\n"
# The container's ancestors from the root ("") down to its pod: where dmem is enabled.
ANCESTORS = ["/".join(CONTAINER.split("/")[:depth]) for depth in range(CONTAINER.count("/") + 1)]


class FakeKernel:
    """Writes the cgroup files the dmem limiter writes as the kernel does; records every write. `fail` makes the
    write to a path fail with an errno."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []
        self.fail: dict[str, int] = {}

    def __call__(self, path: str, text: str) -> None:
        if path in self.fail:
            raise OSError(self.fail[path], os.strerror(self.fail[path]))
        self.writes.append((path, text))
        name = os.path.basename(path)
        if name == "cgroup.subtree_control":
            words = Path(path).read_text().split()
            for word in text.split():
                if word.startswith("+") and word[1:] not in words:
                    words.append(word[1:])
                elif word.startswith("-") and word[1:] in words:
                    words.remove(word[1:])
            Path(path).write_text(" ".join(words) + "\n")
        elif name == "dmem.max":
            held = parse_dmem(Path(path).read_text())
            current_file = Path(path).with_name("dmem.current")
            current = parse_dmem(current_file.read_text()) if current_file.exists() else {}
            for line in text.splitlines():
                region, value = line.split()
                if region not in held:
                    raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
                new = None if value == "max" else int(value)
                if new is not None and (current.get(region) or 0) > new:
                    continue  # set_resource_max drops page_counter_set_max's -EBUSY: the old limit stays
                held[region] = new
            Path(path).write_text("".join(f"{r} {'max' if v is None else v}\n" for r, v in held.items()))
        else:
            raise OSError(errno.EACCES, f"the fake kernel does not write {name}")


def dmem_lines(values: dict[str, int | None]) -> str:
    return "".join(f"{r} {'max' if v is None else v}\n" for r, v in values.items())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A cgroup v2 hierarchy at tmp/cgroup with the dmem controller, two GPUs' regions and one container's cgroup,
    where nothing has dmem in its subtree_control yet; tmp's own subtree_control stands above the root."""
    (tmp_path / "cgroup.subtree_control").write_text("cpu\n")
    top = tmp_path / "cgroup"
    (top / CONTAINER).mkdir(parents=True)
    (top / "cgroup.controllers").write_text("cpuset cpu io memory pids dmem\n")
    (top / "dmem.capacity").write_text(
        dmem_lines({AMD_VRAM: 206158430208, XE_VRAM0: 17179869184, XE_VRAM1: 17179869184})
    )
    (top / "dmem.current").write_text(dmem_lines({AMD_VRAM: 3 * GiB, XE_VRAM0: 0, XE_VRAM1: 0}))
    for ancestor in ANCESTORS:
        (top / ancestor / "cgroup.subtree_control").write_text(SUBTREE)
    for cgroup in (POD, CONTAINER):
        (top / cgroup / "dmem.max").write_text(dmem_lines({AMD_VRAM: None, XE_VRAM0: None, XE_VRAM1: None}))
        (top / cgroup / "dmem.current").write_text(dmem_lines({AMD_VRAM: 1 * GiB, XE_VRAM0: 0, XE_VRAM1: 0}))
    (top / CONTAINER / "cgroup.subtree_control").write_text("")
    return top


@pytest.fixture
def kernel() -> FakeKernel:
    return FakeKernel()


@pytest.fixture
def limiter(root: Path, kernel: FakeKernel) -> DmemMemoryLimiter:
    return DmemMemoryLimiter(str(root), SLOTS.get, write=kernel)


def container(root: Path) -> str:
    return str(root / CONTAINER)


def held(root: Path, cgroup: str = CONTAINER) -> dict[str, int | None]:
    return parse_dmem((root / cgroup / "dmem.max").read_text())


Call = Callable[[DmemMemoryLimiter, int, str], object]
GET: Call = lambda limiter, gpu, path: limiter.get(gpu, path)  # noqa: E731
SET: Call = lambda limiter, gpu, path: limiter.set(gpu, path, 0, 8 * GiB)  # noqa: E731
CALLS = [pytest.param(GET, id="get"), pytest.param(SET, id="set")]


@pytest.mark.parametrize("call", CALLS)
def test_no_controller_is_unavailable_on_the_whole_node(root: Path, limiter: DmemMemoryLimiter, call: Call) -> None:
    """A kernel without dmem in cgroup.controllers holds no limit on any GPU, and the message says enforcement is
    reactive."""
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    with pytest.raises(LimitsUnavailable) as raised:
        call(limiter, 0, container(root))
    assert raised.value.whole_driver
    assert "reactively" in str(raised.value) and "CONFIG_CGROUP_DMEM" in str(raised.value)


def test_the_controller_once_seen_is_not_read_again(root: Path, limiter: DmemMemoryLimiter) -> None:
    """The positive answer is kept: a later call does not read cgroup.controllers."""
    assert limiter.get(0, container(root)) is None
    (root / "cgroup.controllers").unlink()
    assert limiter.get(0, container(root)) is None


@pytest.mark.parametrize(
    ("gpu", "said"),
    [
        pytest.param(3, f"the {I915} driver registers no dmem region", id="driver-registers-no-region"),
        pytest.param(2, "GPU 2 is not a DRM GPU", id="not-a-drm-gpu"),
    ],
)
@pytest.mark.parametrize("call", CALLS)
def test_a_gpu_without_a_region_is_unavailable_on_that_gpu(
    root: Path, limiter: DmemMemoryLimiter, call: Call, gpu: int, said: str
) -> None:
    """A GPU whose driver registers no dmem region, or which is no DRM GPU, cannot hold limits; the others can."""
    with pytest.raises(LimitsUnavailable) as raised:
        call(limiter, gpu, container(root))
    assert not raised.value.whole_driver
    assert said in str(raised.value)


@pytest.mark.parametrize("gpu", [0, 1])
def test_the_root_holds_no_limit(root: Path, limiter: DmemMemoryLimiter, gpu: int) -> None:
    """At the v2 root (where the probe asks, and which has no dmem.max) a GPU with a region answers None."""
    assert limiter.get(gpu, str(root)) is None


@pytest.mark.parametrize(
    ("gpu", "max_values", "current", "found"),
    [
        pytest.param(0, {AMD_VRAM: None}, {AMD_VRAM: GiB}, None, id="max-is-no-limit"),
        pytest.param(0, {AMD_VRAM: 8 * GiB}, {AMD_VRAM: GiB}, DriverLimit(0, 8 * GiB, GiB), id="amdgpu-limit"),
        pytest.param(0, {AMD_VRAM: 8 * GiB}, None, DriverLimit(0, 8 * GiB, 0), id="no-dmem-current-is-no-usage"),
        pytest.param(
            1,
            {AMD_VRAM: 8 * GiB, XE_VRAM0: 4 * GiB, XE_VRAM1: 4 * GiB},
            {AMD_VRAM: GiB, XE_VRAM0: 2 * GiB, XE_VRAM1: 3 * GiB},
            DriverLimit(0, 4 * GiB, 5 * GiB),
            id="xe-both-tiles-usage-summed",
        ),
        pytest.param(
            1,
            {XE_VRAM0: 4 * GiB, XE_VRAM1: None},
            {XE_VRAM0: GiB, XE_VRAM1: 0},
            DriverLimit(0, LIMIT_MAX, GiB),
            id="xe-one-tile-open-is-the-loosest",
        ),
        pytest.param(1, {AMD_VRAM: 8 * GiB, XE_VRAM0: None, XE_VRAM1: None}, None, None, id="another-gpus-limit"),
    ],
)
def test_get_reads_the_regions(
    root: Path,
    limiter: DmemMemoryLimiter,
    gpu: int,
    max_values: dict[str, int | None],
    current: dict[str, int] | None,
    found: DriverLimit | None,
) -> None:
    """dmem.max's value for the GPU's regions is the hard limit (None where all are max), dmem.current's the usage."""
    (root / CONTAINER / "dmem.max").write_text(dmem_lines(dict(max_values)))
    if current is None:
        (root / CONTAINER / "dmem.current").unlink()
    else:
        (root / CONTAINER / "dmem.current").write_text(dmem_lines(dict(current)))
    assert limiter.get(gpu, container(root)) == found


def test_get_without_the_controller_enabled_is_no_limit(root: Path, limiter: DmemMemoryLimiter) -> None:
    """A cgroup with no dmem.max (its parent does not enable dmem) holds nothing."""
    (root / CONTAINER / "dmem.max").unlink()
    assert limiter.get(0, container(root)) is None


@pytest.mark.parametrize("call", CALLS)
def test_a_cgroup_that_is_gone_fails(root: Path, limiter: DmemMemoryLimiter, call: Call) -> None:
    """A cgroup directory that does not exist is a failure naming it."""
    path = str(root / POD / "gone")
    with pytest.raises(LimitFailed, match=f"no cgroup at {path}"):
        call(limiter, 0, path)


def test_set_writes_the_region_and_enables_dmem_down_to_the_parent(
    tmp_path: Path, root: Path, limiter: DmemMemoryLimiter
) -> None:
    """The GPU's region holds the limit, the other GPU's regions are untouched, and each ancestor from the root to
    the parent has dmem in its subtree_control; the container's own and what is above the root are left alone."""
    limiter.set(0, container(root), 0, 8 * GiB)
    assert held(root) == {AMD_VRAM: 8 * GiB, XE_VRAM0: None, XE_VRAM1: None}
    assert limiter.get(0, container(root)) == DriverLimit(0, 8 * GiB, GiB)
    assert [(root / a / "cgroup.subtree_control").read_text().split() for a in ANCESTORS] == [
        ["cpu", "memory", "pids", "dmem"]
    ] * len(ANCESTORS)
    assert (root / CONTAINER / "cgroup.subtree_control").read_text() == ""
    assert (tmp_path / "cgroup.subtree_control").read_text() == "cpu\n"


def test_set_enables_only_where_missing(root: Path, limiter: DmemMemoryLimiter, kernel: FakeKernel) -> None:
    """An ancestor that lists dmem already is not written; the second set writes dmem.max alone."""
    limiter.set(0, container(root), 0, 8 * GiB)
    kernel.writes.clear()
    limiter.set(0, container(root), 0, 6 * GiB)
    assert kernel.writes == [(f"{container(root)}/dmem.max", f"{AMD_VRAM} {6 * GiB}\n")]


def test_set_on_xe_limits_each_tile(root: Path, limiter: DmemMemoryLimiter) -> None:
    """A two-tile xe GPU's vram0 and vram1 each hold the whole hard limit."""
    limiter.set(1, container(root), 0, 4 * GiB)
    assert held(root) == {AMD_VRAM: None, XE_VRAM0: 4 * GiB, XE_VRAM1: 4 * GiB}
    assert limiter.get(1, container(root)) == DriverLimit(0, 4 * GiB, 0)


def test_clearing_writes_max(root: Path, limiter: DmemMemoryLimiter) -> None:
    """Hard `LIMIT_MAX` writes max to the GPU's region: no limit."""
    limiter.set(0, container(root), 0, 8 * GiB)
    limiter.set(0, container(root), 0, LIMIT_MAX)
    assert held(root) == {AMD_VRAM: None, XE_VRAM0: None, XE_VRAM1: None}
    assert limiter.get(0, container(root)) is None


def test_clearing_where_dmem_is_off_writes_nothing(root: Path, limiter: DmemMemoryLimiter, kernel: FakeKernel) -> None:
    """A cgroup without dmem.max holds no limit: clearing it enables nothing and writes nothing."""
    (root / CONTAINER / "dmem.max").unlink()
    limiter.set(0, container(root), 0, LIMIT_MAX)
    assert kernel.writes == []


def test_the_soft_limit_is_ignored(root: Path, limiter: DmemMemoryLimiter) -> None:
    """The kernel has no soft limit: only the hard one is written, and get reports soft 0."""
    limiter.set(0, container(root), 2 * GiB, 8 * GiB)
    assert held(root)[AMD_VRAM] == 8 * GiB
    assert limiter.get(0, container(root)) == DriverLimit(0, 8 * GiB, GiB)


def test_a_max_below_the_usage_that_the_kernel_ignored_fails(root: Path, limiter: DmemMemoryLimiter) -> None:
    """Linux 7.2 keeps the old limit, without an error, where the cgroup holds more than the new one: read back, it
    is a failure that names the usage."""
    limiter.set(0, container(root), 0, 8 * GiB)
    with pytest.raises(LimitFailed) as raised:
        limiter.set(0, container(root), 0, GiB // 2)
    assert f"kept the old limit ({8 * GiB})" in str(raised.value)
    assert "already holds 1.0GiB" in str(raised.value)
    assert held(root)[AMD_VRAM] == 8 * GiB


def test_a_max_that_does_not_read_back_fails(root: Path) -> None:
    """A write the kernel took but that reads back otherwise (a writer that dropped it) is a failure too."""
    dropped = DmemMemoryLimiter(str(root), SLOTS.get, write=lambda path, text: None)
    with pytest.raises(LimitFailed, match=f"dmem.max reads max for {AMD_VRAM} after {8 * GiB} was written"):
        dropped.set(0, container(root), 0, 8 * GiB)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(lambda root: f"{root}/../cgroup/{CONTAINER}", id="dot-dot"),
        pytest.param(lambda root: str(root.parent), id="above-the-root"),
        pytest.param(lambda root: f"{root}x/{CONTAINER}", id="beside-the-root"),
    ],
)
def test_a_path_outside_the_root_is_refused(
    root: Path, limiter: DmemMemoryLimiter, kernel: FakeKernel, call: Call, path: Callable[[Path], str]
) -> None:
    """Nothing outside the v2 root, nor named with .., is read or written."""
    with pytest.raises(LimitFailed, match="refused"):
        call(limiter, 0, path(root))
    assert kernel.writes == []


@pytest.mark.parametrize(
    "failing",
    [
        pytest.param(f"{POD}/cgroup.subtree_control", id="enabling-in-the-pod"),
        pytest.param(f"{CONTAINER}/dmem.max", id="the-limit"),
    ],
)
def test_a_failed_write_names_the_file_and_the_error(
    root: Path, limiter: DmemMemoryLimiter, kernel: FakeKernel, failing: str
) -> None:
    """A write the kernel refuses is a failure with the file and strerror."""
    kernel.fail[str(root / failing)] = errno.EBUSY
    with pytest.raises(LimitFailed, match=f"to {root / failing}: Device or resource busy"):
        limiter.set(0, container(root), 0, 8 * GiB)


def test_the_real_write_on_a_one_region_file(root: Path) -> None:
    """Without a fake kernel the limiter writes the file itself (one region here, so one line is the whole file)."""
    for ancestor in ANCESTORS:
        (root / ancestor / "cgroup.subtree_control").write_text("cpu memory dmem\n")
    (root / CONTAINER / "dmem.max").write_text(f"{AMD_VRAM} max\n")
    (root / CONTAINER / "dmem.current").write_text(f"{AMD_VRAM} 0\n")
    real = DmemMemoryLimiter(str(root), SLOTS.get)
    real.set(0, container(root), 0, 8 * GiB)
    assert (root / CONTAINER / "dmem.max").read_text() == f"{AMD_VRAM} {8 * GiB}\n"
    real.set(0, container(root), 0, LIMIT_MAX)
    assert (root / CONTAINER / "dmem.max").read_text() == f"{AMD_VRAM} max\n"
    assert (root / POD / "cgroup.subtree_control").read_text() == "cpu memory dmem\n"


def test_probe_finds_the_regions(root: Path, limiter: DmemMemoryLimiter) -> None:
    """`probe_limits` over dmem: limits are possible, on the GPUs with a region only."""
    support = probe_limits(limiter, CgroupfsTree(str(root)), [0, 1, 2, 3])
    assert support.possible is True
    assert support.unavailable is None
    assert sorted(support.unsupported) == [2, 3]
    assert support.unanswered == {}


def test_probe_without_the_controller(root: Path, limiter: DmemMemoryLimiter) -> None:
    """`probe_limits` over a kernel without dmem: the node cannot hold limits, and says why."""
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    support = probe_limits(limiter, CgroupfsTree(str(root)), [0, 1])
    assert support.possible is False
    assert support.unavailable is not None and support.unavailable.startswith(NO_CONTROLLER)
