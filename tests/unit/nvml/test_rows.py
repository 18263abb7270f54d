"""Row decoding, bytes in, rows out, over a fake /proc: which row size the rows confirm, and what is wrong with
each row. The sampler over the test NVML library is tested in tests/node/test_nvml.py."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from vramguard.nvml.errors import NvmlErrorKind
from vramguard.nvml.rows import (
    MAX_STRIDE_BYTES,
    STRIDE_R535_BYTES,
    STRIDE_V1_BYTES,
    STRIDE_V2_BYTES,
    check_rows,
    decode_rows,
)

GIB = 1 << 30
NOT_AVAILABLE = 0xFFFF_FFFF_FFFF_FFFF


def _rows(stride: int, *rows: tuple[int, int]) -> bytes:
    """Rows as a driver writes them (pid u32, padding, used bytes u64, the rest of the row) into a buffer with
    room for the widest row, as the sampler allocates it."""
    data = b"".join(struct.pack("=I4xQ", pid, used) + bytes(stride - 16) for pid, used in rows)
    return data.ljust(len(rows) * MAX_STRIDE_BYTES, b"\0")


ME, PARENT, GONE = 100, 200, 300


@pytest.fixture
def proc(tmp_path: Path) -> str:
    """A /proc where ME and PARENT run and GONE does not."""
    for pid in (ME, PARENT):
        (tmp_path / str(pid)).mkdir()
    return str(tmp_path)


@pytest.mark.parametrize(
    ("written", "expected", "decoded"),
    [
        pytest.param(STRIDE_V2_BYTES, STRIDE_V2_BYTES, STRIDE_V2_BYTES, id="v2-as-declared"),
        pytest.param(STRIDE_R535_BYTES, STRIDE_V2_BYTES, STRIDE_R535_BYTES, id="r535-wider-than-declared"),
        pytest.param(STRIDE_V2_BYTES, STRIDE_R535_BYTES, STRIDE_V2_BYTES, id="guessed-r535-but-v2"),
        pytest.param(STRIDE_V1_BYTES, STRIDE_V2_BYTES, STRIDE_V1_BYTES, id="v1-rows"),
    ],
)
def test_decode_rows_finds_the_row_size_the_rows_confirm(written: int, expected: int, decoded: int, proc: str) -> None:
    """The row size is the one whose rows all make sense, whatever the driver declared."""
    raw = _rows(written, (ME, 2 * GIB), (PARENT, 3 * GIB))
    rows, stride = decode_rows(raw, 2, expected, 80 * GIB, {}, proc)
    assert stride == decoded
    assert rows == [(ME, 2 * GIB, None), (PARENT, 3 * GIB, None)]


def test_a_single_row_reads_the_same_under_every_layout(proc: str) -> None:
    """One row cannot tell the layouts apart: the declared size stands."""
    raw = _rows(STRIDE_R535_BYTES, (ME, GIB))
    assert decode_rows(raw, 1, STRIDE_V2_BYTES, 80 * GIB, {}, proc) == ([(ME, GIB, None)], STRIDE_V2_BYTES)


def test_check_rows_names_each_problem(proc: str) -> None:
    """PID 0, more used than the GPU has, and a PID not in /proc are each named; an unknown amount is not one."""
    raw = _rows(STRIDE_V2_BYTES, (ME, GIB), (0, GIB), (PARENT, 81 * GIB), (GONE, GIB), (ME, NOT_AVAILABLE))
    rows, sane = check_rows(raw, 5, STRIDE_V2_BYTES, 80 * GIB, {}, proc)
    assert rows == [
        (ME, GIB, None),
        (0, GIB, NvmlErrorKind.INVALID_PID),
        (PARENT, 81 * GIB, NvmlErrorKind.USED_EXCEEDS_TOTAL),
        (GONE, GIB, NvmlErrorKind.DEAD_PID),
        (ME, None, None),  # NVML_VALUE_NOT_AVAILABLE: the amount is unknown, the process is there
    ]
    assert sane == 2


def test_liveness_is_looked_up_once_per_pid(proc: str) -> None:
    """What an earlier list of this scan found about a PID stands, /proc is not asked again."""
    alive = {ME: False}
    rows, sane = check_rows(_rows(STRIDE_V2_BYTES, (ME, GIB)), 1, STRIDE_V2_BYTES, 80 * GIB, alive, proc)
    assert rows == [(ME, GIB, NvmlErrorKind.DEAD_PID)] and sane == 0
