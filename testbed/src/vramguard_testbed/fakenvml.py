"""A fake NVIDIA driver for tests, the demo and benchmarks: build it, describe a node, point pynvml at it.

`fake_nvml.c` is a `libnvidia-ml.so.1` written against NVIDIA's own `nvml.h`; nvidia-ml-py's real ctypes code
runs over it. It reads the node from the file named by `VRAMGUARD_FAKE_NVML_STATE` on every call, so a test
changes the node by writing a new `FakeNode` over the old file (atomically).

    lib_dir = build_fake_nvml()
    node = FakeNode.gpus(8, total_bytes=80 * GiB)
    node.gpu(0).add_process(os.getpid(), 3 * GiB)
    node.inject_error("nvmlDeviceGetComputeRunningProcesses_v3", NVML_ERROR_GPU_IS_LOST, device=1)
    node.write(state_path)

Two ways to make pynvml load it:
- a subprocess (the agent in the demo and the end-to-end tests): `fake_nvml_env(lib_dir, state_path)` gives an
  environment with `LD_LIBRARY_PATH` and the state variable;
- this process (fast unit tests): `load_fake_nvml(lib_dir)` before pynvml's first `nvmlInit`. Setting
  `LD_LIBRARY_PATH` now would not help: glibc reads it once, at process start. Instead the fake is dlopen'ed by
  its full path; it carries the soname `libnvidia-ml.so.1`, and glibc answers a later `dlopen` of a bare name
  with an already-loaded object of that soname, so pynvml's own `CDLL("libnvidia-ml.so.1")` gets the fake.
  Nothing in pynvml is patched.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vramguard.core.quantity import GiB
from vramguard.core.sample import ProcessKind

STATE_ENV = "VRAMGUARD_FAKE_NVML_STATE"
LIBRARY_NAME = "libnvidia-ml.so.1"
_SOURCE = Path(__file__).with_name("fake_nvml.c")
_CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden")

# nvmlReturn_t values a test is likely to inject (the full list is in nvml.h and pynvml).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_MEMORY = 20  # the fake's stand-in for CUDA_ERROR_OUT_OF_MEMORY from an allocation
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999


class FakeNvmlBuildError(RuntimeError):
    """The fake library could not be built: no C compiler, no nvml.h, or a compile error."""


# --------------------------------------------------------------------------------------------------------------
# Building


def find_nvml_header() -> Path:
    """Where nvidia-nvml-dev put nvml.h (`site-packages/nvidia/<cuda>/include/nvml.h`); the newest CUDA's first."""
    # `nvidia` is a namespace package shared by NVIDIA's wheels: find it without importing anything from it.
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [p for root in roots for p in Path(root).glob("*/include/nvml.h")]
    if not found:
        raise FakeNvmlBuildError(_NO_HEADER)
    return max(found, key=lambda p: [int(t) if t.isdigit() else -1 for t in re.split(r"(\d+)", p.parent.parent.name)])


_NO_HEADER = (
    "nvml.h not found: install NVIDIA's header package with `pip install nvidia-nvml-dev` "
    "(it is in vramguard's dev extra: `pip install -e '.[dev]'`)"
)


def build_fake_nvml(cache_dir: Path | None = None, *, header: Path | None = None, memory_limits: bool = True) -> Path:
    """Compiles the fake NVML once per (source, header, flags); returns the directory holding libnvidia-ml.so.1.

    The library is cached under `cache_dir` (default `~/.cache/vramguard/fake-nvml`) in a directory named by a
    hash of the C source, the header and the flags, so a changed source rebuilds and parallel builds never
    see a half-written file (each compiles to a temporary name, then renames). `memory_limits=False` builds a
    driver before R615: without nvmlDeviceSetMemoryLimits_v1 and nvmlDeviceGetMemoryLimits_v1.
    """
    flags = _CFLAGS if memory_limits else (*_CFLAGS, "-DFAKE_NO_MEMORY_LIMITS")
    header = header if header is not None else find_nvml_header()
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise FakeNvmlBuildError("no C compiler: install one (`apt-get install gcc`) or set CC")
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256()
    for part in (source, header.read_bytes(), " ".join(flags).encode()):
        digest.update(hashlib.sha256(part).digest())
    root = cache_dir if cache_dir is not None else Path.home() / ".cache" / "vramguard" / "fake-nvml"
    lib_dir = root / digest.hexdigest()[:16]
    target = lib_dir / LIBRARY_NAME
    if target.is_file():
        return lib_dir
    lib_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=lib_dir)
    os.close(fd)
    command = [
        compiler,
        *flags,
        f"-I{header.parent}",
        f"-Wl,-soname,{LIBRARY_NAME}",
        "-o",
        tmp,
        str(_SOURCE),
        "-lpthread",
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise FakeNvmlBuildError(f"compiling the fake NVML failed ({' '.join(command)}):\n{result.stderr}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib_dir


# --------------------------------------------------------------------------------------------------------------
# Loading


def fake_nvml_env(lib_dir: Path, state_path: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment for a subprocess whose pynvml should load the fake and read `state_path`."""
    env = dict(os.environ if base is None else base)
    previous = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = str(lib_dir) + (os.pathsep + previous if previous else "")
    env[STATE_ENV] = str(state_path)
    return env


_loaded: list[ctypes.CDLL] = []  # keeps the preloaded library referenced for the life of the process


def load_fake_nvml(lib_dir: Path) -> None:
    """Makes this process's pynvml use the fake library. Call before anything calls nvmlInit.

    Idempotent for the same library. Raises RuntimeError when pynvml already loaded another library (a real
    driver's, or another fake's): a process can hold only one, so such a test must run in a subprocess.
    """
    path = str(lib_dir / LIBRARY_NAME)
    if _loaded and _loaded[0]._name != path:
        # A second object with the same soname would be shadowed by the first for every dlopen by name.
        raise RuntimeError(f"another fake NVML ({_loaded[0]._name}) is already loaded in this process")
    lib = ctypes.CDLL(path)
    if not _loaded:
        _loaded.append(lib)
    import pynvml

    loaded = pynvml.nvmlLib
    if loaded is not None and loaded._handle != lib._handle:
        raise RuntimeError(
            "pynvml already loaded another libnvidia-ml.so.1 in this process; "
            "run code that needs the fake in a subprocess with fake_nvml_env()"
        )


# --------------------------------------------------------------------------------------------------------------
# Describing a node


class MigMode(str, enum.Enum):
    OFF = "off"
    ON = "on"
    UNSUPPORTED = "na"  # nvmlDeviceGetMigMode returns NVML_ERROR_NOT_SUPPORTED


@dataclass(frozen=True, slots=True)
class FakeProcess:
    pid: int
    used_bytes: int | None  # None: the driver reports NVML_VALUE_NOT_AVAILABLE
    kind: ProcessKind = ProcessKind.COMPUTE


# The builders below are mutable on purpose: a test grows a node step by step (add a process, inject an
# error, write, change, write again), as k8s-device-plugin's test builders do.


@dataclass(slots=True)
class FakeMig:
    """One MIG instance: its own UUID, memory and processes."""

    slot: int  # the index nvmlDeviceGetMigDeviceHandleByIndex takes
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int | None = None  # None: the sum of its processes' usage
    reserved_bytes: int = 0
    gpu_instance_id: int = 0
    compute_instance_id: int = 0
    processes: list[FakeProcess] = field(default_factory=list)

    def add_process(self, pid: int, used_bytes: int | None, kind: ProcessKind = ProcessKind.COMPUTE) -> FakeMig:
        self.processes.append(FakeProcess(pid, used_bytes, kind))
        return self


@dataclass(slots=True)
class FakeGpu:
    """One GPU. In MIG mode its processes belong to its MIG instances."""

    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total_bytes: int = 80 * GiB
    used_bytes: int | None = None  # None: the sum of its (and its MIG instances') processes' usage
    reserved_bytes: int = 0  # reported by nvmlDeviceGetMemoryInfo_v2; v1 counts it as used
    mig_mode: MigMode = MigMode.UNSUPPORTED
    migs: list[FakeMig] = field(default_factory=list)
    processes: list[FakeProcess] = field(default_factory=list)

    def add_process(self, pid: int, used_bytes: int | None, kind: ProcessKind = ProcessKind.COMPUTE) -> FakeGpu:
        self.processes.append(FakeProcess(pid, used_bytes, kind))
        return self

    def enable_mig(self, *profiles: int, name_suffix: str = "MIG") -> list[FakeMig]:
        """Turns MIG on with one instance per entry of `profiles` (each its memory in bytes)."""
        self.mig_mode = MigMode.ON
        self.migs = [
            FakeMig(
                slot=slot,
                uuid=f"MIG-{self.index:08x}-0000-0000-0000-{slot:012x}",
                name=f"{self.name} {name_suffix} {slot}",
                total_bytes=total,
                gpu_instance_id=slot + 1,
            )
            for slot, total in enumerate(profiles)
        ]
        return self.migs

    def mig(self, slot: int) -> FakeMig:
        return next(m for m in self.migs if m.slot == slot)


@dataclass(slots=True)
class _Fault:
    function: str
    device: str
    value: str
    hang: bool


DeviceSpec = int | tuple[int, int] | None  # GPU index, (GPU index, MIG slot), or None for every call


@dataclass(slots=True)
class FakeNode:
    """A whole node as the fake driver sees it. `write()` it to the state file to make it so."""

    gpu_list: list[FakeGpu] = field(default_factory=list)
    driver_version: str = "550.54.15"
    nvml_version: str = "12.550.54.15"
    init_error: int | None = None
    memory_v2: bool = True  # False: nvmlDeviceGetMemoryInfo_v2 returns NVML_ERROR_FUNCTION_NOT_FOUND
    r535_layout: bool = False  # the _v3 process functions write 32-byte rows into 24-byte slots
    drop_dead_pids: bool = False  # process lists leave out PIDs that exited, as the real driver does
    memory_limits: bool = False  # R615+: per-cgroup limits work on whole GPUs (else NVML_ERROR_NOT_SUPPORTED)
    allocations: bool = False  # processes may call vgFakeAllocate (`Allocator`), and hold what they got
    faults: list[_Fault] = field(default_factory=list)

    @classmethod
    def gpus(
        cls,
        count: int,
        *,
        total_bytes: int = 80 * GiB,
        name: str = "NVIDIA H100 80GB HBM3",
        mig_mode: MigMode = MigMode.UNSUPPORTED,
    ) -> FakeNode:
        return cls(
            gpu_list=[
                FakeGpu(
                    index=i,
                    uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
                    name=name,
                    total_bytes=total_bytes,
                    mig_mode=mig_mode,
                )
                for i in range(count)
            ]
        )

    def gpu(self, index: int) -> FakeGpu:
        return self.gpu_list[index]

    def inject_error(self, function: str, code: int, device: DeviceSpec = None) -> FakeNode:
        """`function` ("*" for all) returns `code` (an nvmlReturn_t) on `device` (None: every call)."""
        self.faults.append(_Fault(function, _device_spec(device), str(int(code)), hang=False))
        return self

    def hang(self, function: str, seconds: float, device: DeviceSpec = None) -> FakeNode:
        """`function` blocks for `seconds`, or until a state without this hang is written."""
        self.faults.append(_Fault(function, _device_spec(device), repr(float(seconds)), hang=True))
        return self

    def clear_faults(self) -> FakeNode:
        self.faults.clear()
        return self

    def render(self) -> str:
        lines = [
            "# vramguard fake NVML state (see fake_nvml.c for the format)",
            f"driver_version {_token(self.driver_version)}",
            f"nvml_version {_token(self.nvml_version)}",
            f"memory_v2 {int(self.memory_v2)}",
            f"r535_layout {int(self.r535_layout)}",
            f"drop_dead_pids {int(self.drop_dead_pids)}",
            f"memory_limits {int(self.memory_limits)}",
            f"allocations {int(self.allocations)}",
        ]
        if self.init_error is not None:
            lines.append(f"init_error {int(self.init_error)}")
        for gpu in sorted(self.gpu_list, key=lambda g: g.index):
            mig_used = sum(_used(m.processes) if m.used_bytes is None else m.used_bytes for m in gpu.migs)
            used = gpu.used_bytes if gpu.used_bytes is not None else _used(gpu.processes) + mig_used
            free = max(gpu.total_bytes - gpu.reserved_bytes - used, 0)
            lines.append(
                f"gpu {gpu.index} {gpu.mig_mode.value} {gpu.total_bytes} {used} {free} {gpu.reserved_bytes} "
                f"{_token(gpu.uuid)} {_name(gpu.name)}"
            )
            lines.extend(_proc_lines(str(gpu.index), gpu.processes))
            for mig in gpu.migs:
                m_used = mig.used_bytes if mig.used_bytes is not None else _used(mig.processes)
                m_free = max(mig.total_bytes - mig.reserved_bytes - m_used, 0)
                lines.append(
                    f"mig {gpu.index} {mig.slot} {mig.gpu_instance_id} {mig.compute_instance_id} "
                    f"{mig.total_bytes} {m_used} {m_free} {mig.reserved_bytes} {_token(mig.uuid)} {_name(mig.name)}"
                )
                lines.extend(_proc_lines(f"{gpu.index}/{mig.slot}", mig.processes))
        for fault in self.faults:
            verb = "hang" if fault.hang else "error"
            lines.append(f"{verb} {_token(fault.function)} {fault.device} {fault.value}")
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> None:
        """Replaces the state file atomically, so the driver never reads half of it."""
        write_state(path, self.render())


def write_state(path: Path, text: str) -> None:
    """Atomically replaces `path` with `text` (also for hand-written states in tests)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@dataclass(frozen=True)
class DriverLimit:
    """A memory limit the fake driver holds for one cgroup on one GPU (a line of ``<state>.limits``)."""

    gpu: int
    soft_bytes: int
    hard_bytes: int
    cgroup: str


@dataclass(frozen=True)
class LimitCall:
    """One call of nvmlDevice{Set,Get}MemoryLimits_v1, as the fake recorded it (a line of ``<state>.calls``)."""

    verb: str  # "set" or "get"
    gpu: int
    soft_bytes: int  # what was set, or what get returned (0 when it failed)
    hard_bytes: int
    result: int  # the nvmlReturn_t
    at_s: float  # when, on CLOCK_BOOTTIME (the clock of /proc/<pid>/stat's start times)
    cgroup: str


def driver_limits(state_path: Path) -> list[DriverLimit]:
    """The limits the fake driver holds now."""
    return [
        DriverLimit(int(gpu), int(soft), int(hard), cgroup)
        for gpu, soft, hard, cgroup in _side_records(state_path, "limits", 4)
    ]


def limit_calls(state_path: Path) -> list[LimitCall]:
    """Every limits call since the state's side files were last cleared, oldest first."""
    return [
        LimitCall(verb, int(gpu), int(soft), int(hard), int(result), float(at), cgroup)
        for verb, gpu, soft, hard, result, at, cgroup in _side_records(state_path, "calls", 7)
    ]


def clear_driver_state(state_path: Path) -> None:
    """Forget every limit, allocation and recorded call: the driver as after a reboot."""
    for suffix in ("limits", "alloc", "calls"):
        Path(f"{state_path}.{suffix}").unlink(missing_ok=True)


def _side_records(state_path: Path, suffix: str, fields: int) -> list[list[str]]:
    try:
        text = Path(f"{state_path}.{suffix}").read_text()
    except FileNotFoundError:
        return []
    return [line.split(maxsplit=fields - 1) for line in text.splitlines() if line.strip()]


class Allocator:
    """A simulated CUDA process: allocates GPU memory through the fake driver (vgFakeAllocate), which refuses
    what the GPU has not free or what would take a limited cgroup over its hard limit, and holds what it got
    until it exits. Start it where the process should live, e.g. in a container's cgroup::

        proc = ctr.spawn(Allocator.argv(lib_dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=fake_nvml_env(lib_dir, state_path))
        trainer = Allocator(proc)
        trainer.allocate(0, 4 * GiB)    # True: granted; False: out of memory
    """

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    @staticmethod
    def argv(lib_dir: Path) -> list[str]:
        return [sys.executable, "-m", "vramguard_testbed.fakenvml", "allocator", str(lib_dir / LIBRARY_NAME)]

    @property
    def pid(self) -> int:
        return self.process.pid

    def allocate(self, gpu: int, nbytes: int) -> bool:
        """True when the driver granted it, False when it said out of memory; raises on anything else."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{gpu} {nbytes}\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        if answer not in ("ok", "oom"):
            raise RuntimeError(f"allocator {self.pid}: {answer or 'exited'}")
        return answer == "ok"

    def memory_info(self, gpu: int) -> tuple[int, int]:
        """(total, free) bytes as this process sees GPU `gpu` (nvmlDeviceGetMemoryInfo, standing for
        cuMemGetInfo): inside a cgroup that holds a limit itself, the limit and what is left of it."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"info {gpu}\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().split()
        if len(answer) != 2:
            raise RuntimeError(f"allocator {self.pid}: {' '.join(answer) or 'exited'}")
        return int(answer[0]), int(answer[1])


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _serve_allocations(library: str) -> None:
    """The allocator process: one request per line on stdin: "<gpu> <bytes>" answered "ok" or "oom", and
    "info <gpu>" answered "<total> <free>"."""
    lib = ctypes.CDLL(library)
    if lib.nvmlInit_v2() != 0:
        sys.exit("allocator: nvmlInit_v2 failed")
    allocate = lib.vgFakeAllocate
    allocate.argtypes = (ctypes.c_uint, ctypes.c_ulonglong)
    for line in sys.stdin:
        words = line.split()
        if words[0] == "info":
            handle, memory = ctypes.c_void_p(), _Memory()
            code = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(words[1])), ctypes.byref(handle))
            code = code or lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
            answer = f"{memory.total} {memory.free}" if code == 0 else f"error {code}"
        else:
            code = allocate(int(words[0]), int(words[1]))
            answer = "ok" if code == 0 else "oom" if code == NVML_ERROR_MEMORY else f"error {code}"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


def _used(processes: Iterable[FakeProcess]) -> int:
    return sum(p.used_bytes or 0 for p in processes)


def _proc_lines(device: str, processes: Iterable[FakeProcess]) -> list[str]:
    return [f"proc {device} {p.kind.value} {p.pid} {'na' if p.used_bytes is None else p.used_bytes}" for p in processes]


def _device_spec(device: DeviceSpec) -> str:
    if device is None:
        return "*"
    if isinstance(device, tuple):
        return f"{device[0]}/{device[1]}"
    return str(device)


def _token(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} must be one word for the fake NVML state file")
    return value


def _name(value: str) -> str:
    if not value.strip() or "\n" in value:
        raise ValueError(f"{value!r} is not a usable device name")
    return value.strip()


if __name__ == "__main__":
    if sys.argv[1:2] == ["allocator"]:  # Allocator's process
        _serve_allocations(sys.argv[2])
    else:  # `python -m vramguard_testbed.fakenvml`: build, print the directory for scripts
        sys.stdout.write(f"{build_fake_nvml()}\n")
