"""Where libnvidia-ml.so.1 comes from, and loading it for pynvml.

Three ways to find it, one per `NvmlLocation`: the dynamic loader's search (where the NVIDIA container runtime put
the driver's libraries into the container, or LD_LIBRARY_PATH), a driver root (the host directory a driver is
installed in, mounted into the container: its own layouts put the library in one of `LIBRARY_DIRS`), or the file
named outright. `load_library` opens the file itself and hands it to pynvml (its `nvmlLib`, which nvmlInit then
uses), so the agent knows which file it loaded and, where none loads, can say each place it tried.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vramguard.nvml.errors import NvmlUnavailable

LIBRARY_NAME = "libnvidia-ml.so.1"

# Where the driver's own layouts put the library under its root, most specific first: RHEL-family and SUSE
# (usr/lib64), Debian-family multiarch (usr/lib/<triplet>), GKE's installer (lib64; lib before it moved), the GPU
# Operator's driver containers (a whole distribution's root: one of the first three).
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib",
    "usr/lib",
)

# What to set where the loader's search finds nothing: the chart's values first (most agents run from it).
_WHAT_TO_SET = (
    "Install the NVIDIA driver on the node and give the agent its libraries: run its pod with the NVIDIA "
    "container runtime (the chart's runtimeClassName: nvidia where it is not the node's default runtime), or name "
    "the host directory the driver is installed in with the chart's driver.root (/run/nvidia/driver for the GPU "
    "Operator's driver container, /home/kubernetes/bin/nvidia on GKE, / for a driver installed on the host; the "
    "agent's --driver-root), or the library itself with driver.nvmlLibrary (--nvml-library); outside a pod, put "
    "the library's directory on LD_LIBRARY_PATH."
)


@dataclass(frozen=True, slots=True)
class NvmlLocation:
    """Where to load NVML from. Neither field: the dynamic loader's search. `driver_root`: the driver's layouts
    under it. `library`: that file (within `driver_root` when both are set)."""

    driver_root: str = ""
    library: str = ""


LOADER_SEARCH = NvmlLocation()  # where the NVIDIA container runtime puts the library, or LD_LIBRARY_PATH


def candidates(location: NvmlLocation) -> tuple[str, ...]:
    """The files to try, in order: one for a named library, one per layout under a driver root, and the bare name
    (the dynamic loader's search) for neither."""
    if location.library:
        if location.driver_root:
            return (os.path.join(location.driver_root, location.library.lstrip("/")),)
        return (location.library,)
    if location.driver_root:
        return tuple(os.path.join(location.driver_root, d, LIBRARY_NAME) for d in LIBRARY_DIRS)
    return (LIBRARY_NAME,)


def not_found(location: NvmlLocation, tried: Sequence[tuple[str, str]]) -> str:
    """Why NVML could not be loaded: each file tried with why it failed, and what to set."""
    where = "; ".join(f"{path}: {reason}" for path, reason in tried)
    if location.library:
        return (
            f"NVML is not available: the NVML library could not be loaded ({where}). Set the chart's "
            "driver.nvmlLibrary (the agent's --nvml-library) to the library's path within driver.root, or leave it "
            "empty to search the driver's layouts."
        )
    if location.driver_root:
        return (
            f"NVML is not available: {LIBRARY_NAME} was not found under the driver root {location.driver_root} "
            f"(tried {where}). Set the chart's driver.root (the agent's --driver-root) to the host directory the "
            "driver is installed in, or name the library within it with driver.nvmlLibrary."
        )
    return f"NVML is not available: {LIBRARY_NAME} was not found on the dynamic loader's search path ({where}). " + (
        _WHAT_TO_SET
    )


def load_library(
    nv: Any,
    location: NvmlLocation,
    *,
    open_library: Callable[[str], Any] = ctypes.CDLL,
    maps_path: str = "/proc/self/maps",
) -> str:
    """Load NVML from `location` into `nv` (pynvml) unless it holds a library already, and return the loaded file's
    path. Raises `NvmlUnavailable` naming every file tried. Call it on the NVML worker thread, before nvmlInit: a
    library's initialisers run at load."""
    with nv.libLoadLock:  # pynvml's own: it loads under it too, and nvmlInit reads nvmlLib
        if nv.nvmlLib is None:
            tried: list[tuple[str, str]] = []
            for path in candidates(location):
                if os.sep in path and not os.path.exists(path):
                    tried.append((path, "no such file"))
                    continue
                try:
                    nv.nvmlLib = open_library(path)
                except OSError as e:
                    tried.append((path, str(e).replace(f"{path}: ", "", 1) or type(e).__name__))
                    continue
                break
            else:
                raise NvmlUnavailable(not_found(location, tried))
        name = str(getattr(nv.nvmlLib, "_name", "") or LIBRARY_NAME)
    return loaded_path(name, maps_path)


def loaded_path(name: str, maps_path: str = "/proc/self/maps") -> str:
    """The file a library loaded as `name` maps: `name` itself when it is a path, else the first mapping of a file
    whose name starts with it (the loader's search found it; "libnvidia-ml.so.1" maps as
    libnvidia-ml.so.<driver version>), else `name`."""
    if os.sep in name:
        return name
    stem = name.split(".so", 1)[0] + ".so"
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[5:]
                if path and os.path.basename(path[0]).startswith(stem):
                    return path[0]
    except OSError:
        pass
    return name
