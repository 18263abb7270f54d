"""The dmem limiter's pure parts: the kernel's ``<region> <value>`` files parsed, a GPU's regions picked from
dmem.capacity, the text written to dmem.max, and which paths it may write under. The limiter over a stand-in cgroup
tree is in tests/node/test_dmem.py."""

from __future__ import annotations

import pytest

from vramguard.core.ports import LIMIT_MAX
from vramguard.node.dmem import dmem_max_text, gpu_regions, parse_dmem, within_root

AMD = "0000:c1:00.0"
XE = "0000:03:00.0"
CAPACITY = {
    f"drm/{AMD}/vram": 206158430208,
    f"drm/{XE}/vram0": 17179869184,
    f"drm/{XE}/vram1": 17179869184,
    f"drm/{XE}/stolen": 67108864,
    "drm/0000:04:00.0/vram0": 8589934592,
}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        pytest.param(f"drm/{AMD}/vram 206158430208\n", {f"drm/{AMD}/vram": 206158430208}, id="capacity-line"),
        pytest.param(f"drm/{AMD}/vram max\n", {f"drm/{AMD}/vram": None}, id="max-is-no-limit"),
        pytest.param(
            f"drm/{XE}/vram0 1073741824\ndrm/{XE}/vram1 max\n",
            {f"drm/{XE}/vram0": 1073741824, f"drm/{XE}/vram1": None},
            id="two-regions",
        ),
        pytest.param(f"drm/{AMD}/vram 0\n", {f"drm/{AMD}/vram": 0}, id="zero"),
        pytest.param(f"drm/{AMD}/vram\t4096", {f"drm/{AMD}/vram": 4096}, id="tab-and-no-newline"),
        pytest.param(f"drm/{AMD}/vram 1G\n", {}, id="memparse-suffix-is-write-only"),
        pytest.param(f"drm/{AMD}/vram -1\n", {}, id="negative"),
        pytest.param(f"drm/{AMD}/vram\n", {}, id="no-value"),
        pytest.param(f"drm/{AMD}/vram 1 2\n", {}, id="extra-field"),
        pytest.param(f"drm/{AMD}/vram ١٢\n", {}, id="non-ascii-digits"),
        pytest.param("\n\n", {}, id="blank-lines"),
        pytest.param("", {}, id="empty"),
    ],
)
def test_parse_dmem(text: str, parsed: dict[str, int | None]) -> None:
    """Each line is a region and bytes or ``max``; a line that is anything else is left out."""
    assert parse_dmem(text) == parsed


@pytest.mark.parametrize(
    ("slot", "regions"),
    [
        pytest.param(AMD, (f"drm/{AMD}/vram",), id="amdgpu-vram-no-digit"),
        pytest.param(XE, (f"drm/{XE}/vram0", f"drm/{XE}/vram1"), id="xe-two-tiles-both-not-stolen"),
        pytest.param("0000:04:00.0", ("drm/0000:04:00.0/vram0",), id="xe-one-tile"),
        pytest.param("0000:05:00.0", (), id="i915-registers-none"),
        pytest.param("0000:c1:00", (), id="slot-prefix-is-not-a-match"),
    ],
)
def test_gpu_regions(slot: str, regions: tuple[str, ...]) -> None:
    """A GPU's regions are its own ``drm/<slot>/vram*``, no other memory kind and no other GPU's."""
    assert gpu_regions(CAPACITY, slot) == regions


@pytest.mark.parametrize(
    ("regions", "hard", "text"),
    [
        pytest.param((f"drm/{AMD}/vram",), 8 << 30, f"drm/{AMD}/vram 8589934592\n", id="bytes"),
        pytest.param((f"drm/{AMD}/vram",), LIMIT_MAX, f"drm/{AMD}/vram max\n", id="limit-max-clears"),
        pytest.param(
            (f"drm/{XE}/vram0", f"drm/{XE}/vram1"),
            4096,
            f"drm/{XE}/vram0 4096\ndrm/{XE}/vram1 4096\n",
            id="each-tile-the-whole-limit",
        ),
    ],
)
def test_dmem_max_text(regions: tuple[str, ...], hard: int, text: str) -> None:
    """One line per region, the hard limit in bytes on each, ``max`` for no limit."""
    assert dmem_max_text(regions, hard) == text


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        pytest.param("/sys/fs/cgroup", True, id="the-root"),
        pytest.param("/sys/fs/cgroup/", True, id="the-root-trailing-slash"),
        pytest.param("/sys/fs/cgroup/kubepods/burstable/pod1/c1", True, id="a-container"),
        pytest.param("/sys/fs/cgroupx/kubepods", False, id="a-sibling-with-the-root-as-prefix"),
        pytest.param("/sys/fs", False, id="above-the-root"),
        pytest.param("/sys/fs/cgroup/../cgroup/kubepods", False, id="dot-dot-even-back-inside"),
        pytest.param("/sys/fs/cgroup/kubepods/../../../etc", False, id="dot-dot-out"),
        pytest.param("kubepods/burstable", False, id="relative"),
    ],
)
def test_within_root(path: str, inside: bool) -> None:
    """Only the root and what is below it, named plainly, are written under."""
    assert within_root("/sys/fs/cgroup", path) is inside
