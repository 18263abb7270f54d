"""The DRM node readers' pure parts: sysfs attribute parsing, which fd links are DRM nodes, the scan's budget and
order. The readers over stand-in /sys and /proc trees around real processes are in tests/node/test_drm.py."""

from __future__ import annotations

import pytest

from vramguard.node.drm import (
    DrmNode,
    DrmTopology,
    FdScanLimits,
    ScanBudget,
    drm_candidate,
    fdinfo_text,
    parse_dev,
    parse_int,
    parse_pci_slot,
    parse_text_attr,
    scan_order,
)
from vramguard_testbed.fakes import FakeClock


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        pytest.param(b"226:128\n", (226, 128), id="render-node"),
        pytest.param(b"226:0", (226, 0), id="no-newline"),
        pytest.param(b"226:", None, id="no-minor"),
        pytest.param(b"226 128\n", None, id="no-colon"),
        pytest.param(b"-1:3\n", None, id="negative"),
        pytest.param(b"", None, id="empty"),
    ],
)
def test_parse_dev(text: bytes, parsed: tuple[int, int] | None) -> None:
    """A node's `dev` file is "major:minor"; anything else is no node."""
    assert parse_dev(text) == parsed


@pytest.mark.parametrize(
    ("uevent", "slot"),
    [
        pytest.param(
            b"DRIVER=amdgpu\nPCI_CLASS=38000\nPCI_ID=1002:74A1\nPCI_SUBSYS_ID=1002:74A1\n"
            b"PCI_SLOT_NAME=0000:03:00.0\nMODALIAS=pci:v00001002d000074A1\n",
            "0000:03:00.0",
            id="amdgpu-pci-device",
        ),
        pytest.param(b"PCI_SLOT_NAME=0000:C1:00.0\n", "0000:c1:00.0", id="hex-lowered-as-fdinfo-prints-it"),
        pytest.param(b"DRIVER=amdgpu_xcp_drv\nMODALIAS=platform:amdgpu_xcp_1\n", None, id="xcp-platform-device"),
        pytest.param(b"PCI_SLOT_NAME=\n", None, id="empty-value"),
        pytest.param(b"", None, id="empty"),
    ],
)
def test_parse_pci_slot(uevent: bytes, slot: str | None) -> None:
    """The PCI slot comes from PCI_SLOT_NAME; a device without one (an XCP partition) has no PCI address."""
    assert parse_pci_slot(uevent) == slot


@pytest.mark.parametrize(
    ("text", "base", "value"),
    [
        pytest.param(b"0x1002\n", 16, 0x1002, id="vendor-amd"),
        pytest.param(b"0x8086\n", 16, 0x8086, id="vendor-intel"),
        pytest.param(b"206141652992\n", 10, 206141652992, id="mi300x-vram-total-bytes"),
        pytest.param(b"0\n", 10, 0, id="zero-used"),
        pytest.param(b"", 10, None, id="missing"),
        pytest.param(b"lots\n", 10, None, id="not-a-number"),
    ],
)
def test_parse_int(text: bytes, base: int, value: int | None) -> None:
    """Vendor ids are hex, amdgpu's memory counters are bytes in decimal."""
    assert parse_int(text, base) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param(b"2a5c3e8f0b1d4e67\n", "2a5c3e8f0b1d4e67", id="present"),
        pytest.param(b"\n", None, id="empty-when-the-gpu-has-none"),
        pytest.param(b"", None, id="missing"),
    ],
)
def test_parse_text_attr(text: bytes, value: str | None) -> None:
    """amdgpu prints an empty unique_id for a GPU without one: that is no id, not an empty one."""
    assert parse_text_attr(text) == value


@pytest.mark.parametrize(
    ("target", "verdict"),
    [
        pytest.param("/dev/dri/renderD128", True, id="render-node"),
        pytest.param("/dev/dri/card1", True, id="card-node"),
        pytest.param("/dev/kfd", False, id="kfd-has-no-drm-fdinfo"),
        pytest.param("/dev/nvidia0", False, id="nvidia"),
        pytest.param("socket:[12345]", False, id="socket"),
        pytest.param("anon_inode:[eventfd]", False, id="anon-inode"),
        pytest.param("/data/model.bin", False, id="ordinary-file-never-stated"),
        pytest.param("/host-dev/dri/renderD130", None, id="dri-dir-elsewhere"),
        pytest.param("/dev/renderD128", None, id="node-name-elsewhere"),
        pytest.param("/dev/dri", False, id="the-directory-itself"),
        pytest.param("renderD128", False, id="relative"),
    ],
)
def test_drm_candidate(target: str, verdict: bool | None) -> None:
    """A link under /dev/dri is DRM; one that only looks like a node is stat'd; anything else is not."""
    assert drm_candidate(target) is verdict


def test_drm_candidate_with_a_stand_in_prefix() -> None:
    """Tests stand a directory in for /dev/dri; the real /dev/dri is then only a candidate."""
    assert drm_candidate("/tmp/x/dri/renderD128", "/tmp/x/dri/") is True
    assert drm_candidate("/dev/dri/renderD128", "/tmp/x/dri/") is None


def test_budget_counts_fds_bytes_and_time() -> None:
    """Each dimension alone ends the scan: entries, bytes, or the clock."""
    clock = FakeClock()
    limits = FdScanLimits(fds_per_scan=2, bytes_per_scan=100, time_per_scan_s=1.0)
    by_fds = ScanBudget(limits, clock)
    by_fds.spend_fd()
    assert not by_fds.spent()
    by_fds.spend_fd()
    assert by_fds.spent()

    by_bytes = ScanBudget(limits, clock)
    by_bytes.spend_bytes(99)
    assert not by_bytes.spent()
    by_bytes.spend_bytes(1)
    assert by_bytes.spent()

    by_time = ScanBudget(limits, clock)
    clock.step(0.999)
    assert not by_time.spent()
    clock.step(0.001)
    assert by_time.spent()


@pytest.mark.parametrize(
    ("pids", "behind", "order"),
    [
        pytest.param([3, 1, 2], (), (3, 1, 2), id="as-given"),
        pytest.param([1, 2, 3, 4], (3, 4), (3, 4, 1, 2), id="not-reached-first"),
        pytest.param([1, 2], (9, 2), (2, 1), id="gone-from-the-set-dropped"),
        pytest.param([1, 1, 2], (), (1, 2), id="each-once"),
    ],
)
def test_scan_order(pids: list[int], behind: tuple[int, ...], order: tuple[int, ...]) -> None:
    """The PIDs a budget cut off are read first next time, so every process is reached in turn."""
    assert scan_order(pids, behind) == order


def test_fdinfo_text_keeps_undecodable_bytes() -> None:
    """The default parser hands on the text as written; bytes that are not UTF-8 survive a round trip."""
    data = b"drm-driver:\tamdgpu\ndrm-client-name:\t\xff\n"
    assert fdinfo_text(data).encode("utf-8", "surrogateescape") == data


def test_topology_lookups() -> None:
    """A node is found by minor, a GPU by PCI slot; a node kind is read from its name."""
    render = DrmNode("renderD128", 226, 128, "0000:03:00.0")
    xcp = DrmNode("renderD129", 226, 129, None)
    topo = DrmTopology(gpus=(), nodes=(render, xcp))
    assert topo.node(129) == xcp
    assert topo.node(0) is None
    assert topo.gpu("0000:03:00.0") is None
    assert (render.kind, DrmNode("card0", 226, 0, None).kind, DrmNode("accel0", 261, 0, None).kind) == (
        "renderD",
        "card",
        "accel",
    )
