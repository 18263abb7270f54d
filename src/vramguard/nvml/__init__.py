"""The NVML adapter, in the order a sample flows through it:

- `library`: where libnvidia-ml.so.1 is (the loader's search, a driver root's layouts, or a named file), loaded
  for pynvml, or every place tried;
- `sampler`: `NvmlSampler`, the `GpuSampler` seam: devices, MIG instances, memory and processes per scan;
- `deadline`: runs each GPU's calls on a worker thread under a deadline, abandoning a hung one;
- `rows`: which process-list functions the driver has, and decoding their rows (the R535 row-size trap);
- `errors`: the error kinds the agent counts, dropped rows, and messages that say what to do;
- `memory_limit`: `NvmlMemoryLimiter`, the `MemoryLimiter` seam: the driver's per-cgroup memory limits (R615+), and
  whether this nvidia-ml-py binds them.
"""

from vramguard.nvml.errors import DroppedRow, NvmlErrorKind, NvmlUnavailable
from vramguard.nvml.library import LIBRARY_DIRS, LOADER_SEARCH, NvmlLocation, candidates
from vramguard.nvml.memory_limit import BINDINGS_SINCE, NvmlMemoryLimiter, binding_version, binds_limits
from vramguard.nvml.rows import STRIDE_R535_BYTES, STRIDE_V1_BYTES, STRIDE_V2_BYTES, ProcessApi, probe_process_api
from vramguard.nvml.sampler import DEFAULT_CALL_TIMEOUT_S, NvmlSampler

__all__ = [
    "BINDINGS_SINCE",
    "DEFAULT_CALL_TIMEOUT_S",
    "LIBRARY_DIRS",
    "LOADER_SEARCH",
    "STRIDE_R535_BYTES",
    "STRIDE_V1_BYTES",
    "STRIDE_V2_BYTES",
    "DroppedRow",
    "NvmlErrorKind",
    "NvmlLocation",
    "NvmlMemoryLimiter",
    "NvmlSampler",
    "NvmlUnavailable",
    "ProcessApi",
    "binding_version",
    "binds_limits",
    "candidates",
    "probe_process_api",
]
