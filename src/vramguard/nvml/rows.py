"""Process rows: which process-list functions a driver has, and decoding the rows they write.

The R535 trap: R535.43-535.86 drivers write 32-byte rows from the `_v3` process functions while declaring the
24-byte struct, which shifts every field from the second row on. The sampler therefore reads the lists into its
own buffer, with room for the widest known row; the expected row size comes from probing the driver's symbols
(`probe_process_api`, as nvitop does), and when rows decoded with it are not sane (PID alive under the proc
root, usage within the device) the other known row sizes are tried and the one with the most sane rows wins
(`decode_rows`). Pure but for the liveness check, which looks at the proc root once per PID per scan.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from vramguard.nvml.errors import NvmlErrorKind

# Row sizes of the process-info structs: v1 (pid, used), v2 (+ GPU and compute instance IDs), and what R535.43-
# 535.86 really wrote from the _v3 functions (+ confidential-compute protected memory).
STRIDE_V1_BYTES = 16
STRIDE_V2_BYTES = 24
STRIDE_R535_BYTES = 32
STRIDES = (STRIDE_V2_BYTES, STRIDE_R535_BYTES, STRIDE_V1_BYTES)
MAX_STRIDE_BYTES = max(STRIDES)
_ROW_FORMATS = {stride: struct.Struct(f"=I4xQ{stride - 16}x") for stride in STRIDES}
_NOT_AVAILABLE = 0xFFFF_FFFF_FFFF_FFFF
_PID_MAX = 4_194_304  # PID_MAX_LIMIT on 64-bit Linux: no PID is ever larger

Row = tuple[int, "int | None", "NvmlErrorKind | None"]
"""(pid, used bytes or None when NVML does not know, the row's problem or None when it is sane)."""


@dataclass(frozen=True, slots=True)
class ProcessApi:
    """Which process-list functions a driver has, and the row size it is expected to write."""

    suffix: str  # "_v3", "_v2", or "" for the unversioned v1 functions
    stride_bytes: int


def probe_process_api(has_symbol: Callable[[str], bool]) -> ProcessApi:
    """Chooses the process-list functions and the row size to expect from the symbols the driver exports.

    nvitop's rule: a driver that exports the confidential-computing API but not yet
    `nvmlDeviceGetRunningProcessDetailList` is of the R535 branch that wrote 32-byte rows from `_v3`; later
    drivers moved the wide rows to the new function and went back to 24 bytes. Only a first guess: the sampler
    checks it against the rows themselves, so exact version boundaries do not matter.
    """
    if has_symbol("nvmlDeviceGetComputeRunningProcesses_v3"):
        r535 = has_symbol("nvmlDeviceGetConfComputeMemSizeInfo") and not has_symbol(
            "nvmlDeviceGetRunningProcessDetailList"
        )
        return ProcessApi("_v3", STRIDE_R535_BYTES if r535 else STRIDE_V2_BYTES)
    if has_symbol("nvmlDeviceGetComputeRunningProcesses_v2"):
        return ProcessApi("_v2", STRIDE_V2_BYTES)
    return ProcessApi("", STRIDE_V1_BYTES)


def decode_rows(
    raw: bytes, count: int, stride_bytes: int, total_bytes: int, alive: dict[int, bool], proc_root: str
) -> tuple[list[Row], int]:
    """The rows, decoded with the row size the rows themselves confirm; (rows, that row size).

    `stride_bytes` is tried first; when some of its rows are not sane, every other known size is tried and the
    one with the most sane rows wins. A single row reads the same under every layout.
    """
    rows, sane = check_rows(raw, count, stride_bytes, total_bytes, alive, proc_root)
    if sane == count or count < 2:
        return rows, stride_bytes
    best = stride_bytes
    for stride in STRIDES:
        if stride != stride_bytes:
            candidate, candidate_sane = check_rows(raw, count, stride, total_bytes, alive, proc_root)
            if candidate_sane > sane:
                rows, sane, best = candidate, candidate_sane, stride
    return rows, best


def check_rows(
    raw: bytes, count: int, stride_bytes: int, total_bytes: int, alive: dict[int, bool], proc_root: str
) -> tuple[list[Row], int]:
    """Decodes rows and checks each: (rows with their problem or None, how many are sane).

    `alive` caches, per scan, whether a PID exists under `proc_root`. The hot loop of a scan, hence written out:
    a warm 8-GPU node with 64 processes each runs it 512 times.
    """
    checked: list[Row] = []
    sane = 0
    proc = proc_root + "/"
    access, f_ok = os.access, os.F_OK
    for pid, raw_used in _ROW_FORMATS[stride_bytes].iter_unpack(raw[: count * stride_bytes]):
        used = None if raw_used == _NOT_AVAILABLE else raw_used
        problem = None
        if not 0 < pid <= _PID_MAX:
            problem = NvmlErrorKind.INVALID_PID
        elif used is not None and used > total_bytes:
            problem = NvmlErrorKind.USED_EXCEEDS_TOTAL
        else:
            exists = alive.get(pid)
            if exists is None:
                exists = alive[pid] = access(proc + str(pid), f_ok)
            if exists:
                sane += 1
            else:
                problem = NvmlErrorKind.DEAD_PID
        checked.append((pid, used, problem))
    return checked, sane
