"""DRM fdinfo: the kernel documents' examples and amdgpu's three forms parse to bytes per region, hostile texts cost
bounded work, and a client shared by fds or processes is counted once, charged to its lowest PID."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from vramguard.core.drm_usage import (
    MAX_FDINFO_BYTES,
    MAX_FDINFO_LINES,
    MAX_REGIONS,
    DrmFdinfo,
    DrmProcessUsage,
    FdReading,
    RegionMemory,
    parse_fdinfo,
    usage_by_process,
)
from vramguard.core.quantity import GiB, MiB

KiB = 1024

# The examples of the drivers' documents that drm-usage-stats.rst links to (Linux 7.2.13), indentation trimmed:
# Documentation/gpu/i915.rst, panfrost.rst, panthor.rst (GPL-2.0 / GPL-2.0+) and the usage-stats comment of
# drivers/gpu/drm/xe/xe_drm_client.c (MIT, its tabs printed as spaces there).
I915 = """\
pos:    0
flags:  0100002
mnt_id: 21
drm-driver: i915
drm-pdev:   0000:00:02.0
drm-client-id:      7
drm-engine-render:  9288864723 ns
drm-engine-copy:    2035071108 ns
drm-engine-video:   0 ns
drm-engine-capacity-video:   2
drm-engine-video-enhance:   0 ns
"""
PANFROST = """\
pos:    0
flags:  02400002
mnt_id: 27
ino:    531
drm-driver:     panfrost
drm-client-id:  14
drm-engine-fragment:    1846584880 ns
drm-cycles-fragment:    1424359409
drm-maxfreq-fragment:   799999987 Hz
drm-curfreq-fragment:   799999987 Hz
drm-engine-vertex-tiler:        71932239 ns
drm-cycles-vertex-tiler:        52617357
drm-maxfreq-vertex-tiler:       799999987 Hz
drm-curfreq-vertex-tiler:       799999987 Hz
drm-total-memory:       290 MiB
drm-shared-memory:      0 MiB
drm-active-memory:      226 MiB
drm-resident-memory:    36496 KiB
drm-purgeable-memory:   128 KiB
"""
PANTHOR = """\
pos:    0
flags:  02400002
mnt_id: 29
ino:    491
drm-driver:     panthor
drm-client-id:  10
drm-engine-panthor:     111110952750 ns
drm-cycles-panthor:     94439687187
drm-maxfreq-panthor:    1000000000 Hz
drm-curfreq-panthor:    1000000000 Hz
panthor-resident-memory:        10396 KiB
panthor-active-memory:  10396 KiB
drm-total-memory:       16480 KiB
drm-shared-memory:      0
drm-active-memory:      16200 KiB
drm-resident-memory:    16480 KiB
drm-purgeable-memory:   0
"""
XE = """\
pos:    0
flags:  0100002
mnt_id: 26
ino:    685
drm-driver:     xe
drm-client-id:  3
drm-pdev:       0000:03:00.0
drm-total-system:       0
drm-shared-system:      0
drm-active-system:      0
drm-resident-system:    0
drm-purgeable-system:   0
drm-total-gtt:  192 KiB
drm-shared-gtt: 0
drm-active-gtt: 0
drm-resident-gtt:       192 KiB
drm-total-vram0:        23992 KiB
drm-shared-vram0:       16 MiB
drm-active-vram0:       0
drm-resident-vram0:     23992 KiB
drm-total-stolen:       0
drm-shared-stolen:      0
drm-active-stolen:      0
drm-resident-stolen:    0
drm-cycles-rcs: 28257900
drm-total-cycles-rcs:   7655183225
drm-cycles-bcs: 0
drm-total-cycles-bcs:   7655183225
drm-cycles-vcs: 0
drm-total-cycles-vcs:   7655183225
drm-engine-capacity-vcs:        2
drm-cycles-vecs:        0
drm-total-cycles-vecs:  7655183225
drm-engine-capacity-vecs:       2
drm-cycles-ccs: 0
drm-total-cycles-ccs:   7655183225
drm-engine-capacity-ccs:        4
"""

# No kernel document has an amdgpu example; these follow what amdgpu_fdinfo.c prints in each form (the header from
# drm_show_fdinfo where the driver does not print its own), with values made up here.
# Linux 7.2: drm_print_memory_stats per region, then the legacy keys (resident / 1024, with a space before the tab
# on gtt and cpu), amd- keys and engine times. The resident VRAM is 1536 MiB + 512 bytes: printed in bytes, and
# truncated in the legacy key.
AMDGPU_72 = (
    "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1093\n"
    "drm-driver:\tamdgpu\ndrm-client-id:\t17\ndrm-pdev:\t0000:c1:00.0\ndrm-client-name:\tpytorch\npasid:\t32771\n"
    "drm-total-vram:\t1610613248\ndrm-shared-vram:\t0\ndrm-resident-vram:\t1610613248\ndrm-purgeable-vram:\t0\n"
    "drm-total-gtt:\t2 MiB\ndrm-shared-gtt:\t0\ndrm-resident-gtt:\t2 MiB\ndrm-purgeable-gtt:\t0\n"
    "drm-total-cpu:\t0\ndrm-shared-cpu:\t0\ndrm-resident-cpu:\t0\ndrm-purgeable-cpu:\t0\n"
    "drm-total-doorbell:\t8 KiB\ndrm-shared-doorbell:\t0\ndrm-resident-doorbell:\t8 KiB\ndrm-purgeable-doorbell:\t0\n"
    "drm-memory-vram:\t1572864 KiB\ndrm-memory-gtt: \t2048 KiB\ndrm-memory-cpu: \t0 KiB\n"
    "amd-evicted-vram:\t0 KiB\namd-requested-vram:\t1572864 KiB\namd-requested-gtt:\t2048 KiB\n"
    "drm-engine-compute:\t81234567 ns\n"
)
# Linux 6.12: legacy and amd- keys, then drm-shared-, all in KiB; no drm-total- and no drm-resident-.
AMDGPU_612 = (
    "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1093\n"
    "drm-driver:\tamdgpu\ndrm-client-id:\t9\ndrm-pdev:\t0000:03:00.0\npasid:\t32769\n"
    "drm-memory-vram:\t4194304 KiB\ndrm-memory-gtt: \t10240 KiB\ndrm-memory-cpu: \t0 KiB\n"
    "amd-memory-visible-vram:\t262144 KiB\namd-evicted-vram:\t0 KiB\namd-evicted-visible-vram:\t0 KiB\n"
    "amd-requested-vram:\t4194304 KiB\namd-requested-visible-vram:\t0 KiB\namd-requested-gtt:\t10240 KiB\n"
    "drm-shared-vram:\t1024 KiB\ndrm-shared-gtt:\t0 KiB\ndrm-shared-cpu:\t0 KiB\n"
)
# Linux 6.1 and the ROCm DKMS driver: amdgpu's own header (pasid first, the VM's fence context as client id).
AMDGPU_61 = (
    "pos:\t0\nflags:\t02100002\nmnt_id:\t26\n"
    "pasid:\t32770\ndrm-driver:\tamdgpu\ndrm-pdev:\t0000:83:00.0\ndrm-client-id:\t1287\n"
    "drm-memory-vram:\t20971520 KiB\ndrm-memory-gtt: \t4096 KiB\ndrm-memory-cpu: \t0 KiB\n"
    "drm-engine-compute:\t9918273645 ns\n"
)


def regions(**by_name: RegionMemory) -> dict[str, RegionMemory]:
    return by_name


R = RegionMemory
PARSED = {
    "i915-doc-example-no-memory-keys": (I915, DrmFdinfo("i915", "0000:00:02.0", 7)),
    "panfrost-doc-example-no-pdev-system-memory": (
        PANFROST,
        DrmFdinfo("panfrost", None, 14, regions(memory=R(36496 * KiB, 290 * MiB, 0))),
    ),
    "panthor-doc-example-driver-keys-skipped-bare-zero-is-bytes": (
        PANTHOR,
        DrmFdinfo("panthor", None, 10, regions(memory=R(16480 * KiB, 16480 * KiB, 0))),
    ),
    "xe-doc-example-total-cycles-is-no-region": (
        XE,
        DrmFdinfo(
            "xe",
            "0000:03:00.0",
            3,
            regions(
                gtt=R(192 * KiB, 192 * KiB, 0),
                stolen=R(0, 0, 0),
                system=R(0, 0, 0),
                vram0=R(23992 * KiB, 23992 * KiB, 16 * MiB),
            ),
        ),
    ),
    "amdgpu-7.2-exact-resident-wins-over-the-truncated-legacy-key": (
        AMDGPU_72,
        DrmFdinfo(
            "amdgpu",
            "0000:c1:00.0",
            17,
            regions(
                cpu=R(0, 0, 0),
                doorbell=R(8 * KiB, 8 * KiB, 0),
                gtt=R(2 * MiB, 2 * MiB, 0),
                vram=R(1536 * MiB + 512, 1536 * MiB + 512, 0),
            ),
        ),
    ),
    "amdgpu-6.12-legacy-key-is-resident-no-total": (
        AMDGPU_612,
        DrmFdinfo(
            "amdgpu",
            "0000:03:00.0",
            9,
            regions(cpu=R(0, None, 0), gtt=R(10 * MiB, None, 0), vram=R(4 * GiB, None, MiB)),
        ),
    ),
    "amdgpu-6.1-own-header-legacy-keys-only": (
        AMDGPU_61,
        DrmFdinfo("amdgpu", "0000:83:00.0", 1287, regions(cpu=R(0), gtt=R(4 * MiB), vram=R(20 * GiB))),
    ),
    "not-a-drm-file": ("pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t7\n", DrmFdinfo()),
    "empty": ("", DrmFdinfo()),
    "memory-keys-without-drm-driver-are-no-drm-stats": (
        "drm-resident-vram:\t1 MiB\n",
        DrmFdinfo(None, None, None, regions(vram=R(MiB))),
    ),
    "a-vmd-domain-past-16-bits": (
        "drm-driver:\tamdgpu\ndrm-pdev:\t10000:e1:00.0\n",
        DrmFdinfo("amdgpu", "10000:e1:00.0"),
    ),
    "crlf-and-spaces-around-values": (
        "drm-driver: amdgpu \r\ndrm-client-id:  5\r\ndrm-resident-vram:   3 KiB\t\r\n",
        DrmFdinfo("amdgpu", None, 5, regions(vram=R(3 * KiB))),
    ),
    "bytes-in-ascii": (
        AMDGPU_61.encode(),
        DrmFdinfo("amdgpu", "0000:83:00.0", 1287, regions(cpu=R(0), gtt=R(4 * MiB), vram=R(20 * GiB))),
    ),
    "a-repeated-key-keeps-its-first-value": (
        "drm-driver:\tamdgpu\ndrm-driver:\txe\ndrm-resident-vram:\t1 KiB\ndrm-resident-vram:\t1 MiB\n",
        DrmFdinfo("amdgpu", None, None, regions(vram=R(KiB))),
    ),
}


@pytest.mark.parametrize(("text", "expected"), PARSED.values(), ids=PARSED.keys())
def test_parse(text: str | bytes, expected: DrmFdinfo) -> None:
    """Each text parses to its driver, PCI slot, client and bytes per region; other lines are skipped."""
    assert parse_fdinfo(text) == expected


DEVICE_BYTES = {
    "amdgpu-vram": (AMDGPU_72, 1536 * MiB + 512),
    "amdgpu-6.12-legacy-vram": (AMDGPU_612, 4 * GiB),
    "xe-vram0-not-gtt-nor-system": (XE, 23992 * KiB),
    "i915-local-regions-not-stolen-local": (
        "drm-driver:\ti915\ndrm-resident-local0:\t1 MiB\ndrm-resident-local1:\t2 MiB\n"
        "drm-resident-stolen-local0:\t4 MiB\ndrm-resident-system0:\t8 MiB\n",
        3 * MiB,
    ),
    "system-memory-only-is-none": (PANFROST, None),
    "no-resident-counter-is-none": ("drm-driver:\tx\ndrm-total-vram:\t1 MiB\n", None),
}


@pytest.mark.parametrize(("text", "expected"), DEVICE_BYTES.values(), ids=DEVICE_BYTES.keys())
def test_device_resident_bytes(text: str, expected: int | None) -> None:
    """What a VRAM quota counts: resident bytes of the GPU's own regions only."""
    assert parse_fdinfo(text).device_resident_bytes == expected


SIZES = {
    "bare-number-is-bytes": ("4096", 4096),
    "zero": ("0", 0),
    "kib": ("23992 KiB", 23992 * KiB),
    "mib": ("16 MiB", 16 * MiB),
    "tab-before-unit": ("2\tMiB", 2 * MiB),
    "gib-is-no-unit-of-the-format": ("1 GiB", None),
    "kb-is-not-kib": ("4 kB", None),
    "unit-without-space": ("4KiB", None),
    "lowercase-unit": ("4 kib", None),
    "negative": ("-1", None),
    "fraction": ("1.5 MiB", None),
    "hex": ("0x10", None),
    "empty": ("", None),
    "unit-alone": ("KiB", None),
    "max-u64-bytes-passes-int64": (str(2**64 - 1), None),
    "largest-int64": (str(2**63 - 1), 2**63 - 1),
    "mib-past-int64": (f"{2**44} MiB", None),
    "twenty-one-digits": ("1" * 21, None),
    "trailing-garbage": ("12 KiB extra", None),
}


@pytest.mark.parametrize(("value", "expected"), SIZES.values(), ids=SIZES.keys())
def test_sizes(value: str, expected: int | None) -> None:
    """A size is bytes, or a number and a blank and KiB or MiB; anything else is a bad line, never a size."""
    parsed = parse_fdinfo(f"drm-driver:\tx\ndrm-resident-vram:\t{value}\n")
    assert parsed.device_resident_bytes == expected
    assert parsed.bad_lines == (expected is None)


BAD = {
    "bad-pdev": ("drm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00\n", DrmFdinfo("amdgpu", bad_lines=1)),
    "uppercase-pdev": ("drm-driver:\tamdgpu\ndrm-pdev:\t0000:C1:00.0\n", DrmFdinfo("amdgpu", bad_lines=1)),
    "client-id-past-u64": ("drm-driver:\tx\ndrm-client-id:\t18446744073709551616\n", DrmFdinfo("x")),
    "client-id-negative": ("drm-driver:\tx\ndrm-client-id:\t-3\n", DrmFdinfo("x", bad_lines=1)),
    "driver-with-a-blank": ("drm-driver:\tam dgpu\n", DrmFdinfo(None, bad_lines=1)),
    "driver-name-too-long": (f"drm-driver:\t{'a' * 65}\n", DrmFdinfo(None, bad_lines=1)),
    "driver-empty": ("drm-driver:\t\n", DrmFdinfo()),
    "bad-size-is-skipped-the-rest-read": (
        "drm-driver:\tx\ndrm-resident-vram:\t12 GiB\ndrm-total-vram:\t1 MiB\n",
        DrmFdinfo("x", regions=regions(vram=R(None, MiB)), bad_lines=1),
    ),
    "line-without-colon": ("drm-driver:\tx\ngarbage\n\n", DrmFdinfo("x", bad_lines=1)),
    "region-name-with-control-character": ("drm-driver:\tx\ndrm-resident-v\x1bram:\t1\n", DrmFdinfo("x", bad_lines=1)),
    "active-and-purgeable-not-read": ("drm-driver:\tx\ndrm-active-vram:\t1\ndrm-purgeable-vram:\t1\n", DrmFdinfo("x")),
    "non-ascii-byte-makes-only-its-line-unreadable": (
        b"drm-driver:\tx\ndrm-resident-vr\xffam:\t1\ndrm-resident-vram:\t2\n",
        DrmFdinfo("x", regions=regions(vram=R(2)), bad_lines=1),
    ),
}


@pytest.mark.parametrize(("text", "expected"), BAD.values(), ids=BAD.keys())
def test_bad_values_are_skipped_and_counted(text: str | bytes, expected: DrmFdinfo) -> None:
    """A value that does not parse is left out (never read as something else) and counted."""
    assert parse_fdinfo(text) == expected


def test_a_text_past_the_byte_bound_is_cut_at_a_whole_line() -> None:
    """Past MAX_FDINFO_BYTES nothing is read, and the line the bound cuts is dropped, not read short."""
    head = "drm-driver:\tamdgpu\n" + "amd-pad:" + "0" * (MAX_FDINFO_BYTES - 50) + "\n"
    cut_line = "drm-resident-vram:\t1572868 KiB\n"
    assert len(head) < MAX_FDINFO_BYTES < len(head) + len(cut_line)
    for text in (head + cut_line, (head + cut_line).encode()):
        parsed = parse_fdinfo(text)
        assert (parsed.driver, parsed.regions, parsed.truncated) == ("amdgpu", {}, True)
    assert parse_fdinfo(head).truncated is False


def test_a_text_past_the_line_bound_is_not_read_further() -> None:
    """Past MAX_FDINFO_LINES lines the rest is not read, and the reading says so."""
    text = "drm-driver:\tx\n" + "\n" * (MAX_FDINFO_LINES - 1) + "drm-resident-vram:\t1\n"
    parsed = parse_fdinfo(text)
    assert (parsed.driver, parsed.regions, parsed.truncated) == ("x", {}, True)
    exactly = "drm-driver:\tx\n" + "p:\t0\n" * (MAX_FDINFO_LINES - 1)
    assert parse_fdinfo(exactly).truncated is False


def test_regions_past_the_bound_are_not_kept() -> None:
    """At most MAX_REGIONS regions; a text naming more keeps the first ones and says it was cut."""
    text = "drm-driver:\tx\n" + "".join(f"drm-resident-r{i}:\t{i}\n" for i in range(MAX_REGIONS + 5))
    parsed = parse_fdinfo(text)
    assert len(parsed.regions) == MAX_REGIONS and parsed.truncated
    assert parsed.regions["r0"] == R(0) and f"r{MAX_REGIONS}" not in parsed.regions


# Each several hundred times the byte bound, built when the test runs; what lies past the bound would change the
# result if it were read.
# Each several hundred times the byte bound, built when the test runs; what lies past the bound would change the
# result if it were read. With it, the driver the head names (None: no whole line within the bound).
HOSTILE = {
    "one-huge-line": (lambda: "drm-driver:\tx\ndrm-resident-vram:\t" + "9" * 4_000_000 + "\n", "x"),
    "a-million-lines": (lambda: "drm-driver:\tx\n" + "\n" * 1_000_000 + "drm-resident-vram:\t1\n", "x"),
    "only-colons": (lambda: ":" * 4_000_000 + "\ndrm-driver:\tx\ndrm-resident-vram:\t1\n", None),
    "bytes-without-a-newline": (lambda: b"drm-driver:\tx" + b"\xff" * 4_000_000 + b"\ndrm-resident-vram:\t1\n", None),
}


@pytest.mark.parametrize(("make", "driver"), HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_texts_are_read_only_to_the_bound(make: Callable[[], str | bytes], driver: str | None) -> None:
    """Megabytes of text: only the bounded head is read, and the reading says it was cut."""
    parsed = parse_fdinfo(make())
    assert (parsed.driver, parsed.regions, parsed.truncated) == (driver, {}, True)


def info(pdev: str | None, client: int | None, vram: int, gtt: int = 0, driver: str = "amdgpu") -> DrmFdinfo:
    return DrmFdinfo(driver, pdev, client, regions(gtt=R(gtt, gtt), vram=R(vram, vram)))


GPU0 = "0000:03:00.0"
GPU1 = "0000:c1:00.0"


def usage(
    pid: int, pdev: str, vram: int, gtt: int = 0, clients: tuple[int, ...] = (), shared_with: tuple[int, ...] = ()
) -> DrmProcessUsage:
    return DrmProcessUsage(pid, pdev, "amdgpu", regions(gtt=R(gtt, gtt), vram=R(vram, vram)), clients, shared_with)


AGGREGATE = {
    "dups-of-one-file-in-one-process-count-once": (
        [FdReading(10, 5, info(GPU0, 1, GiB)), FdReading(10, 6, info(GPU0, 1, GiB))],
        [usage(10, GPU0, GiB, clients=(1,))],
    ),
    "two-opens-in-one-process-add-up": (
        [FdReading(10, 5, info(GPU0, 1, GiB, MiB)), FdReading(10, 6, info(GPU0, 2, 2 * GiB, MiB))],
        [usage(10, GPU0, 3 * GiB, 2 * MiB, clients=(1, 2))],
    ),
    "a-client-shared-by-processes-goes-to-the-lowest-pid": (
        [
            FdReading(31, 4, info(GPU0, 1, GiB)),
            FdReading(12, 4, info(GPU0, 1, GiB)),
            FdReading(20, 9, info(GPU0, 1, GiB)),
        ],
        [usage(12, GPU0, GiB, clients=(1,), shared_with=(20, 31))],
    ),
    "a-sharer-keeps-its-own-clients": (
        [
            FdReading(12, 4, info(GPU0, 1, GiB)),
            FdReading(20, 4, info(GPU0, 1, GiB)),
            FdReading(20, 5, info(GPU0, 2, MiB)),
        ],
        [usage(12, GPU0, GiB, clients=(1,), shared_with=(20,)), usage(20, GPU0, MiB, clients=(2,))],
    ),
    "two-readings-of-one-client-keep-the-larger": (
        [FdReading(10, 5, info(GPU0, 1, GiB)), FdReading(10, 6, info(GPU0, 1, GiB + MiB))],
        [usage(10, GPU0, GiB + MiB, clients=(1,))],
    ),
    "one-client-id-on-two-gpus-is-two-clients": (
        [FdReading(10, 5, info(GPU0, 1, GiB)), FdReading(11, 6, info(GPU1, 1, 2 * GiB))],
        [usage(10, GPU0, GiB, clients=(1,)), usage(11, GPU1, 2 * GiB, clients=(1,))],
    ),
    "a-process-on-two-gpus-has-a-row-each": (
        [FdReading(10, 5, info(GPU1, 2, 2 * GiB)), FdReading(10, 6, info(GPU0, 1, GiB))],
        [usage(10, GPU0, GiB, clients=(1,)), usage(10, GPU1, 2 * GiB, clients=(2,))],
    ),
    "fds-without-a-client-id-count-as-one-the-largest": (
        [FdReading(10, 5, info(GPU0, None, GiB)), FdReading(10, 6, info(GPU0, None, 2 * GiB))],
        [usage(10, GPU0, 2 * GiB)],
    ),
    "no-drm-driver-is-not-counted": ([FdReading(10, 5, DrmFdinfo())], []),
}


@pytest.mark.parametrize(("readings", "expected"), AGGREGATE.values(), ids=AGGREGATE.keys())
def test_usage_by_process(readings: list[FdReading], expected: list[DrmProcessUsage]) -> None:
    """Each (pdev, client) is counted once, in the lowest PID holding it; rows per (pid, pdev), sorted."""
    assert usage_by_process(readings).processes == tuple(expected)
    assert usage_by_process(reversed(readings)).processes == tuple(expected)  # the order /proc is read in


def test_fds_without_a_pdev_are_counted_apart() -> None:
    """A GPU that is not a PCI device has no slot to charge: its fds are counted, not charged."""
    scan = usage_by_process([FdReading(10, 5, parse_fdinfo(PANFROST)), FdReading(10, 6, info(GPU0, 1, GiB))])
    assert scan.without_pdev == 1
    assert scan.processes == (usage(10, GPU0, GiB, clients=(1,)),)


def test_a_cut_reading_marks_its_row() -> None:
    """A row built from a text cut at a bound says so: its bytes may be short."""
    cut = DrmFdinfo("amdgpu", GPU0, 1, regions(vram=R(GiB)), truncated=True)
    (row,) = usage_by_process([FdReading(10, 5, cut)]).processes
    assert row.truncated and row.device_resident_bytes == GiB


def test_parsed_documents_aggregate() -> None:
    """From text to rows: amdgpu's 7.2 and 6.1 forms on two GPUs, xe on a third, one fd duplicated."""
    scan = usage_by_process(
        [
            FdReading(100, 3, parse_fdinfo(AMDGPU_72)),
            FdReading(100, 4, parse_fdinfo(AMDGPU_72)),
            FdReading(200, 3, parse_fdinfo(AMDGPU_61)),
            FdReading(300, 7, parse_fdinfo(XE)),
        ]
    )
    assert [(r.pid, r.pdev, r.driver, r.device_resident_bytes) for r in scan.processes] == [
        (100, "0000:c1:00.0", "amdgpu", 1536 * MiB + 512),
        (200, "0000:83:00.0", "amdgpu", 20 * GiB),
        (300, "0000:03:00.0", "xe", 23992 * KiB),
    ]
