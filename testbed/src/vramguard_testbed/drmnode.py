"""A stand-in for what the kernel shows of AMD GPUs, written around real processes: a `/sys` with amdgpu's PCI devices
and their card and render nodes, and for each GPU process the `fd/` links and `fdinfo/` texts its render-node fd
would have in `/proc`, in amdgpu's Linux 7.x format (`drm-resident-vram` in KiB, `drm-pdev`, one client id per
open). The processes themselves are real and sit in real cgroups; each holds a plain file standing in for its
render node open (`render_path`), which the killer finds as it finds /dev/dri/renderD128 on a node.

The agent reads it with `--sys-root <root>/sys --fdinfo-root <root>/proc --drm-device-prefix <root>/dev/dri/`; the
rest of /proc (cgroup, stat) is the real one. A process that exits leaves the pod cgroup, so its stale fdinfo is
never read again, as the kernel frees a DRM file's buffers when it is closed.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from vramguard.core.quantity import GiB, MiB

KiB = 1024

MI300X_VRAM_BYTES = 192 * GiB
MI300X_NAME = "AMD Instinct MI300X"
_BUSES = (0xC1, 0xD1, 0xE1, 0xF1, 0x41, 0x51, 0x61, 0x71)  # an 8-GPU MI300X board's, as a node lists them
_RENDER_FD = 5  # the fd number the stand-in gives each process's render node
_BASELINE_BYTES = 256 * MiB  # what the GPU holds with no process (firmware, the kernel's own buffers)


@dataclass(frozen=True)
class StandInGpu:
    """One AMD GPU of the stand-in: its PCI slot, card and render node numbers and VRAM size."""

    slot: str
    card: int
    render: int
    total_bytes: int
    unique_id: str

    @property
    def render_name(self) -> str:
        return f"renderD{self.render}"


class DrmStandIn:
    """AMD GPUs under `root`: `sys/`, `proc/` (fd and fdinfo only) and `dev/dri/` (plain files)."""

    def __init__(self, root: Path, gpus: int = 1, total_bytes: int = MI300X_VRAM_BYTES, name: str = MI300X_NAME):
        self.root = root
        self.sys_root = root / "sys"
        self.fdinfo_root = root / "proc"
        self.dri = root / "dev" / "dri"
        self.gpus = [
            StandInGpu(f"0000:{_BUSES[i]:02x}:00.0", i + 1, 128 + i, total_bytes, f"{0x5A1F00D15EA5E000 + i:016x}")
            for i in range(gpus)
        ]
        self._used: dict[int, tuple[int, int]] = {}  # pid -> (gpu, bytes)
        self._client_ids = itertools.count(100)
        self._clients: dict[int, int] = {}
        self.dri.mkdir(parents=True, exist_ok=True)
        self.fdinfo_root.mkdir(parents=True, exist_ok=True)
        driver = self.sys_root / "bus" / "pci" / "drivers" / "amdgpu"
        driver.mkdir(parents=True, exist_ok=True)
        for gpu in self.gpus:
            self._write_gpu(gpu, name, driver)
        self._write_used()

    def _write_gpu(self, gpu: StandInGpu, name: str, driver: Path) -> None:
        device = self.sys_root / "devices" / "pci0000:00" / gpu.slot
        device.mkdir(parents=True, exist_ok=True)
        files = {
            "uevent": f"DRIVER=amdgpu\nPCI_CLASS=38000\nPCI_ID=1002:74A1\nPCI_SLOT_NAME={gpu.slot}\n",
            "vendor": "0x1002\n",
            "device": "0x74a1\n",
            "mem_info_vram_total": f"{gpu.total_bytes}\n",
            "unique_id": f"{gpu.unique_id}\n",
            "product_name": f"{name}\n",
        }
        for file, text in files.items():
            (device / file).write_text(text)
        _link(device / "driver", os.path.relpath(driver, device))
        for node, minor in ((f"card{gpu.card}", gpu.card), (gpu.render_name, gpu.render)):
            entry = self.sys_root / "class" / "drm" / node
            entry.mkdir(parents=True, exist_ok=True)
            (entry / "dev").write_text(f"226:{minor}\n")
            _link(entry / "device", os.path.relpath(device, entry))
        (self.dri / gpu.render_name).touch()

    def render_path(self, gpu: int = 0) -> Path:
        """The plain file a process on GPU `gpu` holds open, standing in for its render node."""
        return self.dri / self.gpus[gpu].render_name

    def argv(self, command: str) -> list[str]:
        """What `vramguard run` or `top` (`command`) is given to read this stand-in (`run`'s killer: its devices)."""
        found = ["--sys-root", str(self.sys_root), "--fdinfo-root", str(self.fdinfo_root)]
        return found + (["--drm-device-prefix", f"{self.dri}/"] if command == "run" else [])

    def set_usage(self, pid: int, used_bytes: int, gpu: int = 0) -> None:
        """`pid`'s render-node fd holds `used_bytes` of VRAM on `gpu` (its fdinfo rewritten in place, atomically),
        and the GPU's used counter follows."""
        self._used[pid] = (gpu, used_bytes)
        client = self._clients.setdefault(pid, next(self._client_ids))
        process = self.fdinfo_root / str(pid)
        (process / "fd").mkdir(parents=True, exist_ok=True)
        (process / "fdinfo").mkdir(parents=True, exist_ok=True)
        _link(process / "fd" / str(_RENDER_FD), f"/dev/dri/{self.gpus[gpu].render_name}")
        _replace(process / "fdinfo" / str(_RENDER_FD), amdgpu_fdinfo(self.gpus[gpu].slot, client, used_bytes))
        self._write_used()

    def rewrite(self, pid: int, used_bytes: int) -> None:
        """`pid`'s fdinfo text rewritten in place with `used_bytes` (as the kernel prints a busy process's anew on
        every read), nothing else touched: what bench/drm_scan.py changes between samples."""
        gpu, _ = self._used[pid]
        text = amdgpu_fdinfo(self.gpus[gpu].slot, self._clients[pid], used_bytes)
        (self.fdinfo_root / str(pid) / "fdinfo" / str(_RENDER_FD)).write_text(text)

    def forget(self, pid: int) -> None:
        """`pid` exited: what it held is freed."""
        self._used.pop(pid, None)
        self._write_used()

    def used_bytes(self, gpu: int = 0) -> int:
        return _BASELINE_BYTES + sum(b for g, b in self._used.values() if g == gpu)

    def _write_used(self) -> None:
        for i, gpu in enumerate(self.gpus):
            device = self.sys_root / "devices" / "pci0000:00" / gpu.slot
            _replace(device / "mem_info_vram_used", f"{self.used_bytes(i)}\n")


def amdgpu_fdinfo(slot: str, client_id: int, vram_bytes: int) -> str:
    """The fdinfo of an amdgpu render-node fd as Linux 7.x prints it (`amdgpu_show_fdinfo` after `drm_show_fdinfo`:
    the drm- header, memory stats per region with the largest exact unit, then the legacy lines in KiB)."""
    return (
        f"pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1090\n"
        f"drm-driver:\tamdgpu\ndrm-client-id:\t{client_id}\ndrm-pdev:\t{slot}\npasid:\t{32768 + client_id}\n"
        f"drm-total-vram:\t{_size(vram_bytes)}\ndrm-shared-vram:\t0\ndrm-resident-vram:\t{_size(vram_bytes)}\n"
        f"drm-purgeable-vram:\t0\ndrm-total-gtt:\t2 MiB\ndrm-shared-gtt:\t0\ndrm-resident-gtt:\t2 MiB\n"
        f"drm-purgeable-gtt:\t0\ndrm-memory-vram:\t{vram_bytes // KiB} KiB\ndrm-memory-gtt: \t2048 KiB\n"
        f"drm-memory-cpu: \t0 KiB\namd-evicted-vram:\t0 KiB\namd-requested-vram:\t{vram_bytes // KiB} KiB\n"
    )


def _size(n: int) -> str:
    """`drm_fdinfo_print_size`: bytes, or the largest of KiB and MiB that divides them."""
    for unit, size in (("MiB", MiB), ("KiB", KiB)):
        if n and n % size == 0:
            return f"{n // size} {unit}"
    return str(n)


def _link(path: Path, target: str) -> None:
    if path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
