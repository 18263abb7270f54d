"""The sampler: every GPU and MIG instance, its memory and its processes, read under a deadline.

Narrow on purpose, like dcgm-exporter's nvmlprovider: `NvmlSampler.sample()` returns plain `GpuSample` data and
hides NVML's quirks (process lists, memory v1/v2, row sizes, MIG, hung calls) behind it; docs/architecture.md "The
NVML sampler" says how each is handled. Constructed idle: `start()` initialises NVML (on the deadline runner's
thread, as every call), `stop(deadline)` shuts it down and ends that thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.core.sample import GpuDevice, GpuMemory, GpuProcess, GpuSample, ProcessKind
from vramguard.nvml.deadline import DeadlineRunner, Job
from vramguard.nvml.errors import (
    ARGUMENT_VERSION_MISMATCH,
    FUNCTION_NOT_FOUND,
    INSUFFICIENT_SIZE,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    DroppedRow,
    NvmlErrorKind,
    NvmlUnavailable,
    describe,
    init_failure,
)
from vramguard.nvml.library import LIBRARY_NAME, LOADER_SEARCH, NvmlLocation, load_library
from vramguard.nvml.rows import MAX_STRIDE_BYTES, STRIDE_V2_BYTES, Row, decode_rows, probe_process_api

DEFAULT_CALL_TIMEOUT_S = 2.0
_INITIAL_CAPACITY = 32  # rows; grows to twice the largest list seen, so a warm scan needs one call per list
_V2_MISSING = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH})
_MIG_ENABLED = 1


_Call = Callable[..., Any]  # (name, fn, *args, **kwargs) -> fn's result: `Job.call`


@dataclass(slots=True)
class _GpuInfo:
    """What does not change while the driver is loaded: cached after the first scan."""

    handle: Any
    uuid: str
    name: str
    mig_capable: bool | None = None  # None: not asked yet
    max_mig_devices: int = 0


@dataclass(slots=True)
class _ProcessList:
    kind: ProcessKind
    function: str
    fn: Any  # the ctypes function
    stride_bytes: int  # expected row size; updated when the rows prove it wrong


@dataclass(slots=True)
class _GpuScan:
    """What one GPU's unit of work produced. Built on the worker thread, merged on the caller's."""

    devices: list[GpuDevice] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    exited: list[GpuProcess] = field(default_factory=list)  # dead-pid rows, merged per PID as `processes` are
    dropped: list[DroppedRow] = field(default_factory=list)
    errors: list[NvmlErrorKind] = field(default_factory=list)


class _MemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t (nvml.h), a plain ctypes structure: its fields are read in C, not through pynvml's
    printable wrapper."""

    _fields_ = (
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    )


class _MemoryV1(ctypes.Structure):
    """nvmlMemory_t (nvml.h), for a driver before R510."""

    _fields_ = (("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong))


class _Counter:
    """One whole GPU's memory counter, made ready once for the watch: the C function, the handle and the buffer it
    fills, and the last figures read (`last`, None when the last call failed)."""

    __slots__ = ("fn", "handle", "index", "last", "memory", "ref")

    def __init__(self, index: int, fn: Any, handle: Any, v2: bool, version: int) -> None:
        self.index = index
        self.fn = fn
        self.handle = handle
        self.memory: _MemoryV1 | _MemoryV2 = _MemoryV2(version=version) if v2 else _MemoryV1()
        self.ref = ctypes.byref(self.memory)
        self.last: GpuMemory | None = None


class _Counters:
    """Every opened GPU's counter, read in one go (`read`) on the watch's thread alone."""

    __slots__ = ("counters", "indices", "last", "v2")

    def __init__(self, v2: bool, counters: list[_Counter]) -> None:
        self.v2 = v2
        self.counters = counters
        self.indices = [c.index for c in counters]
        self.last: tuple[GpuMemory, ...] = ()  # what `read` returned last

    def read(self, stuck: frozenset[Any]) -> tuple[GpuMemory, ...]:
        """The GPUs' figures; the last tuple again when none moved and none was left out."""
        same = True
        for c in self.counters:
            if (stuck and c.index in stuck) or c.fn(c.handle, c.ref) != SUCCESS:
                c.last, same = None, False
                continue
            m, last = c.memory, c.last
            if last is None or last.used_bytes != m.used or last.free_bytes != m.free or last.total_bytes != m.total:
                c.last, same = GpuMemory(c.index, m.total, m.used, m.free), False
        if not same:
            self.last = tuple(c.last for c in self.counters if c.last is not None)
        return self.last


class NvmlSampler:
    """The `GpuSampler` over NVML (nvidia-ml-py). Raises `NvmlUnavailable` from `start()`, never later; a sampler
    whose start failed is not started again (make a new one).

    `errors` counts problems by kind since the start; `dropped_rows` lists the rows the last `sample()`
    dropped. GPU handles, UUIDs and names are read on the first scan and cached (MIG instances' UUIDs are read
    every scan: instances come and go). The GPU count is read once: GPUs do not appear without a driver reload.
    An unhealthy GPU is reported with its last good memory figures (zeros if there never were any).
    `location` says where libnvidia-ml.so.1 is loaded from (nvml/library.py); `library_path` is the file loaded.
    """

    def __init__(
        self,
        *,
        proc_root: str | os.PathLike[str] = "/proc",
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        clock: Clock = SYSTEM_CLOCK,
        location: NvmlLocation = LOADER_SEARCH,
    ) -> None:
        if call_timeout_s <= 0:
            raise ValueError("call_timeout_s must be positive")
        self._proc_root = os.fspath(proc_root)
        self._timeout_s = call_timeout_s
        self._nv: Any = None  # pynvml, once `start()` imported it
        self._error_names: dict[int, str] = {}
        self.clock = clock
        self._runner = DeadlineRunner(call_timeout_s, "vramguard-nvml", clock)  # its thread starts with a call
        self._lock = threading.Lock()  # one sample() at a time; start and stop too
        self._started = False
        self._stopped = False
        self._errors = dict.fromkeys(NvmlErrorKind, 0)  # since the start, for `errors`
        self._dropped: tuple[DroppedRow, ...] = ()
        self._memory_v2: bool | None = None  # None: not tried yet
        self._capacity_rows = _INITIAL_CAPACITY
        self._gpus: dict[int, _GpuInfo] = {}
        self._names: dict[str, str] = {}  # MIG instance names by UUID
        self._last: dict[int, tuple[GpuDevice, ...]] = {}  # each GPU's devices from its last good scan
        self._last_by_uuid: dict[str, GpuDevice] = {}
        self._lists: tuple[_ProcessList, ...] = ()
        self._counters: _Counters | None = None  # the watch's (`memory`), from the first scan that opened a GPU
        self._location = location  # where libnvidia-ml.so.1 is loaded from (nvml/library.py)
        self.library_path = ""  # the file loaded, read at start
        self.driver_version = ""  # both read at start ("unknown" where NVML would not say)
        self.nvml_version = ""
        self.gpu_count = 0

    # -- the GpuSampler protocol ---------------------------------------------------------------------------

    def sample(self) -> GpuSample:
        with self._lock:
            if not self._started or self._stopped:
                raise RuntimeError("NvmlSampler is not running: sample() between start() and stop()")
            alive: dict[int, bool] = {}
            jobs: dict[int, Job] = {}
            skipped: dict[int, str] = {}
            for index in range(self.gpu_count):
                stuck = self._runner.stuck(index)
                if stuck is not None:
                    since_s = self.clock.now() - (stuck.started_at or self.clock.now())
                    skipped[index] = (
                        f"skipped: {stuck.current_call or 'an NVML call'} on this GPU has not returned "
                        f"for {since_s:.1f}s"
                    )
                else:
                    jobs[index] = Job(index, functools.partial(self._scan_gpu, index=index, alive=alive))
            self._runner.run(list(jobs.values()))

            devices: list[GpuDevice] = []
            processes: list[GpuProcess] = []
            exited: list[GpuProcess] = []
            dropped: list[DroppedRow] = []
            found = dict.fromkeys(NvmlErrorKind, 0)  # this sample's problems, for GpuSample.errors
            for index in range(self.gpu_count):
                job = jobs.get(index)
                if job is None:
                    found[NvmlErrorKind.STUCK] += 1
                    devices.extend(self._unhealthy(index, skipped[index]))
                elif job.timed_out:
                    found[NvmlErrorKind.TIMEOUT] += 1
                    call = job.current_call or "NVML"
                    devices.extend(self._unhealthy(index, f"{call} did not return within {self._timeout_s:g}s"))
                elif job.error is not None:
                    found[NvmlErrorKind.CALL_FAILED] += 1
                    error = describe(self._nv, self._error_names, job.current_call, job.error)
                    devices.extend(self._unhealthy(index, error))
                else:
                    scan: _GpuScan = job.result
                    for kind in scan.errors:
                        found[kind] += 1
                    devices.extend(scan.devices)
                    processes.extend(scan.processes)
                    exited.extend(scan.exited)
                    dropped.extend(scan.dropped)
                    healthy = tuple(d for d in scan.devices if d.healthy)
                    if healthy:
                        self._last[index] = healthy
                        self._last_by_uuid.update((d.uuid, d) for d in healthy)
            self._dropped = tuple(dropped)
            self._counters = self._watch_counters()
            for kind, n in found.items():
                self._errors[kind] += n
            errors = tuple((kind.value, n) for kind, n in found.items() if n)
            return GpuSample(devices=tuple(devices), processes=tuple(processes), errors=errors, exited=tuple(exited))

    def memory(self) -> tuple[GpuMemory, ...]:
        """Each whole GPU's memory counters: one NVML call a GPU, on the caller's thread, with no lock (NVML is
        thread-safe): the watch's reading between scans (`watch.MemoryWatch`), from a thread of its own that a hung
        driver may keep, and only from it (the counters' buffers are its). GPUs no scan has opened yet, stuck ones,
        and any whose call fails are left out (the scans report them). While no GPU's figures move, the same tuple
        comes back: at rest a reading allocates nothing but the figures it reads."""
        counters = self._counters  # published whole by the scans and the stop: read without their lock
        if counters is None:
            return ()
        return counters.read(self._runner.stuck_keys)

    # -- the lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML and read what does not change (driver and NVML versions, GPU count, process-list
        functions), under the call deadline; raises `NvmlUnavailable` saying why it cannot (the deadline runner's
        thread ended)."""
        with self._lock:
            if self._started or self._stopped:
                raise RuntimeError("NvmlSampler is started once")
            self._stopped = True  # until the start succeeds: a failed start leaves nothing to stop
            try:
                self._nv = _import_pynvml()
            except NvmlUnavailable:
                self._runner.close()
                raise
            self._error_names = {
                value: name
                for name, value in vars(self._nv).items()
                if name.startswith("NVML_ERROR_") and isinstance(value, int)
            }
            self._init()
            self._started, self._stopped = True, False

    def stop(self, deadline: float) -> None:
        """Shut NVML down and end the deadline runner's thread. nvmlShutdown runs under the call timeout, as every
        NVML call does, whatever is left until `deadline`: one that hangs is abandoned with its thread."""
        with self._lock:
            self._counters = None  # the watch reads nothing from now on
            if self._stopped or not self._started:
                self._stopped = True
                self._runner.close()
                return
            self._stopped = True
            shutdown = Job("shutdown", lambda job: job.call("nvmlShutdown", self._nv.nvmlShutdown))
            try:
                self._runner.run([shutdown])
            finally:
                self._runner.close()

    # -- what the agent reads besides samples --------------------------------------------------------------

    @property
    def errors(self) -> Mapping[NvmlErrorKind, int]:
        """Problems by kind since the start (a snapshot)."""
        return MappingProxyType(dict(self._errors))

    @property
    def dropped_rows(self) -> tuple[DroppedRow, ...]:
        """The process rows the last sample() dropped, with the reason for each."""
        return self._dropped

    @property
    def process_info_stride_bytes(self) -> int:
        """The row size the compute list's rows currently decode with (24; 32 on an R535 driver)."""
        return self._lists[0].stride_bytes if self._lists else STRIDE_V2_BYTES

    @property
    def threads_started(self) -> int:
        """Worker threads started so far: one, plus one for each call that hung."""
        return self._runner.threads_started

    # -- start-up ------------------------------------------------------------------------------------------

    def _init(self) -> None:
        job = Job("init", self._init_nvml)
        self._runner.run([job])
        if job.timed_out:
            self._runner.close()
            raise NvmlUnavailable(
                f"NVML is not available: {job.current_call or 'nvmlInit'} did not return within "
                f"{self._timeout_s:g}s: the NVIDIA driver is hung (a GPU may have fallen off the bus; look for Xid "
                "errors in the kernel log)"
            )
        if job.error is not None:
            self._runner.close()
            if isinstance(job.error, NvmlUnavailable):
                raise job.error
            raise NvmlUnavailable(init_failure(self._nv, self._error_names, job.current_call, job.error)) from None

    def _init_nvml(self, job: Job) -> None:
        nv = self._nv
        self.library_path = job.call(f"loading {LIBRARY_NAME}", load_library, nv, self._location)
        job.call("nvmlInit", nv.nvmlInit)
        try:
            try:
                self.driver_version = str(job.call("nvmlSystemGetDriverVersion", nv.nvmlSystemGetDriverVersion))
            except nv.NVMLError:
                self.driver_version = "unknown"
            try:
                self.nvml_version = str(job.call("nvmlSystemGetNVMLVersion", nv.nvmlSystemGetNVMLVersion))
            except nv.NVMLError:
                self.nvml_version = "unknown"
            self.gpu_count = int(job.call("nvmlDeviceGetCount_v2", nv.nvmlDeviceGetCount))

            def has_symbol(name: str) -> bool:
                try:
                    nv._nvmlGetFunctionPointer(name)
                except nv.NVMLError:
                    return False
                return True

            api = probe_process_api(has_symbol)
            lists = []
            for kind, stem in (
                (ProcessKind.COMPUTE, "Compute"),
                (ProcessKind.GRAPHICS, "Graphics"),
                (ProcessKind.MPS, "MPSCompute"),
            ):
                name = f"nvmlDeviceGet{stem}RunningProcesses{api.suffix}"
                if has_symbol(name):
                    lists.append(_ProcessList(kind, name, nv._nvmlGetFunctionPointer(name), api.stride_bytes))
            self._lists = tuple(lists)
        except BaseException:
            with contextlib.suppress(nv.NVMLError):  # the first error is the one worth reporting
                nv.nvmlShutdown()
            raise

    # -- one GPU's unit of work (runs on the worker thread) -------------------------------------------------

    def _scan_gpu(self, job: Job, index: int, alive: dict[int, bool]) -> _GpuScan:
        nv = self._nv
        scan = _GpuScan()
        gpu = self._gpus.get(index)
        if gpu is None:
            handle = job.call("nvmlDeviceGetHandleByIndex_v2", nv.nvmlDeviceGetHandleByIndex, index)
            gpu = _GpuInfo(
                handle=handle,
                uuid=str(job.call("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID, handle)),
                name=str(job.call("nvmlDeviceGetName", nv.nvmlDeviceGetName, handle)),
            )
            self._gpus[index] = gpu
        total, used, free = self._memory(job.call, gpu.handle)
        device = GpuDevice(
            index=index, uuid=gpu.uuid, name=gpu.name, total_bytes=total, used_bytes=used, free_bytes=free
        )
        scan.devices.append(device)
        if not self._mig_enabled(job, gpu):
            self._processes(job, gpu.handle, device, alive, scan)
            return scan
        for slot in range(gpu.max_mig_devices):
            try:
                mig_handle = job.call(
                    "nvmlDeviceGetMigDeviceHandleByIndex", nv.nvmlDeviceGetMigDeviceHandleByIndex, gpu.handle, slot
                )
            except nv.NVMLError as e:
                if e.value == NOT_FOUND:  # no instance in this slot
                    continue
                raise
            uuid = str(job.call("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID, mig_handle))
            try:
                name = self._names.get(uuid)
                if name is None:
                    name = self._names[uuid] = str(job.call("nvmlDeviceGetName", nv.nvmlDeviceGetName, mig_handle))
                total, used, free = self._memory(job.call, mig_handle)
                mig = GpuDevice(
                    index=index,
                    uuid=uuid,
                    name=name,
                    total_bytes=total,
                    used_bytes=used,
                    free_bytes=free,
                    mig_index=slot,
                    parent_uuid=gpu.uuid,
                )
                self._processes(job, mig_handle, mig, alive, scan)
                scan.devices.append(mig)
            except nv.NVMLError as e:
                # One broken instance does not hide its siblings; it is reported unhealthy on its own.
                scan.errors.append(NvmlErrorKind.CALL_FAILED)
                last = self._last_by_uuid.get(uuid)
                error = describe(self._nv, self._error_names, job.current_call, e)
                scan.devices.append(
                    replace(last, healthy=False, error=error)
                    if last is not None
                    else GpuDevice(
                        index=index,
                        uuid=uuid,
                        name=self._names.get(uuid, ""),
                        total_bytes=0,
                        used_bytes=0,
                        free_bytes=0,
                        mig_index=slot,
                        parent_uuid=gpu.uuid,
                        healthy=False,
                        error=error,
                    )
                )
        return scan

    def _watch_counters(self) -> _Counters | None:
        """The watch's counters for the GPUs opened so far, in the memory-info version the scans settled on: made
        again only when either changed (the scan's thread, under the lock)."""
        v2, current = self._memory_v2, self._counters
        # A copy first: a late call on an abandoned thread may open a GPU meanwhile.
        opened = sorted(list(self._gpus.items()), key=lambda item: item[0])
        if v2 is None or (current is not None and current.v2 == v2 and current.indices == [i for i, _ in opened]):
            return current
        nv = self._nv
        try:
            fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2" if v2 else "nvmlDeviceGetMemoryInfo")
        except nv.NVMLError:
            return current
        return _Counters(v2, [_Counter(index, fn, gpu.handle, v2, nv.nvmlMemory_v2) for index, gpu in opened])

    def _memory(self, call: _Call, handle: Any) -> tuple[int, int, int]:
        nv = self._nv
        if self._memory_v2 is not False:
            try:
                m = call("nvmlDeviceGetMemoryInfo_v2", nv.nvmlDeviceGetMemoryInfo, handle, version=nv.nvmlMemory_v2)
            except nv.NVMLError as e:
                if e.value not in _V2_MISSING:
                    raise
                self._memory_v2 = False  # a driver before R510: v1 from now on
            else:
                self._memory_v2 = True
                return int(m.total), int(m.used), int(m.free)
        m = call("nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo, handle)
        return int(m.total), int(m.used), int(m.free)

    def _mig_enabled(self, job: Job, gpu: _GpuInfo) -> bool:
        nv = self._nv
        if gpu.mig_capable is False:
            return False
        try:
            current, _pending = job.call("nvmlDeviceGetMigMode", nv.nvmlDeviceGetMigMode, gpu.handle)
        except nv.NVMLError as e:
            if e.value != NOT_SUPPORTED:
                raise
            gpu.mig_capable = False  # a GPU without MIG never gains it: stop asking
            return False
        if not gpu.mig_capable:
            gpu.max_mig_devices = int(
                job.call("nvmlDeviceGetMaxMigDeviceCount", nv.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
            )
            gpu.mig_capable = True
        return bool(current == _MIG_ENABLED)

    def _processes(self, job: Job, handle: Any, device: GpuDevice, alive: dict[int, bool], scan: _GpuScan) -> None:
        merged: dict[int, tuple[ProcessKind, int | None]] = {}
        gone: dict[int, tuple[ProcessKind, int | None]] = {}  # rows of PIDs with no process: exited, not garbage
        for plist in self._lists:
            count, raw = self._read_list(job, plist, handle)
            if not count:
                continue
            rows = self._decode(plist, raw, count, device.total_bytes, alive, scan)
            for pid, used, problem in rows:
                if problem is not None:
                    scan.errors.append(problem)
                    scan.dropped.append(DroppedRow(device.uuid, pid, used, plist.kind, problem))
                    if problem is not NvmlErrorKind.DEAD_PID:
                        continue
                into = merged if problem is None else gone
                seen = into.get(pid)
                if seen is None:
                    into[pid] = (plist.kind, used)
                elif used is not None and (seen[1] is None or used > seen[1]):
                    into[pid] = (seen[0], used)
        uuid = device.uuid
        scan.processes.extend(GpuProcess(pid, uuid, used, kind) for pid, (kind, used) in merged.items())
        scan.exited.extend(GpuProcess(pid, uuid, used, kind) for pid, (kind, used) in gone.items())

    def _read_list(self, job: Job, plist: _ProcessList, handle: Any) -> tuple[int, bytes]:
        """Calls one process-list function into our own buffer: (row count, raw bytes).

        The buffer has room for the widest known row, so a driver writing wider rows than it declares cannot
        overrun it. Passing a capacity rather than asking for the count first needs one call per list when warm.
        """
        job.begin(plist.function)
        for _ in range(4):
            capacity = self._capacity_rows
            buffer = ctypes.create_string_buffer(capacity * MAX_STRIDE_BYTES)
            count = ctypes.c_uint(capacity)
            ret = plist.fn(handle, ctypes.byref(count), buffer)
            if ret == SUCCESS:
                return count.value, buffer.raw
            if ret == INSUFFICIENT_SIZE:
                self._capacity_rows = max(capacity * 2, count.value * 2 + 5)
                continue
            if ret == NOT_SUPPORTED:  # as dcgm-exporter: this device has no such processes to report
                return 0, b""
            raise self._nv.NVMLError(ret)
        raise self._nv.NVMLError(INSUFFICIENT_SIZE)

    def _decode(
        self, plist: _ProcessList, raw: bytes, count: int, total_bytes: int, alive: dict[int, bool], scan: _GpuScan
    ) -> list[Row]:
        rows, stride = decode_rows(raw, count, plist.stride_bytes, total_bytes, alive, self._proc_root)
        if stride != plist.stride_bytes:
            # A driver lays out all its process lists alike, and does not change while loaded: decode them all
            # so from now on.
            scan.errors.append(NvmlErrorKind.LAYOUT_MISMATCH)
            for other in self._lists:
                other.stride_bytes = stride
        return rows

    # -- helpers -------------------------------------------------------------------------------------------

    def _unhealthy(self, index: int, error: str) -> list[GpuDevice]:
        last = self._last.get(index)
        if last is not None:
            return [replace(d, healthy=False, error=error) for d in last]
        gpu = self._gpus.get(index)
        return [
            GpuDevice(
                index=index,
                uuid=gpu.uuid if gpu is not None else f"unknown-gpu-{index}",
                name=gpu.name if gpu is not None else "",
                total_bytes=0,
                used_bytes=0,
                free_bytes=0,
                healthy=False,
                error=error,
            )
        ]


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable(
            "NVML is not available: the nvidia-ml-py package (module pynvml) is not installed; "
            "`pip install nvidia-ml-py`"
        ) from e
    return pynvml
