"""Where libnvidia-ml.so.1 is looked for, what is loaded into pynvml, and what the agent says where nothing loads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from vramguard.nvml.errors import NvmlUnavailable
from vramguard.nvml.library import LIBRARY_NAME, LOADER_SEARCH, NvmlLocation, candidates, load_library, loaded_path


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        pytest.param(LOADER_SEARCH, (LIBRARY_NAME,), id="neither-the-loaders-search"),
        pytest.param(
            NvmlLocation(driver_root="/host/driver"),
            tuple(
                f"/host/driver/{d}/libnvidia-ml.so.1"
                for d in (
                    "usr/lib64",
                    "usr/lib/x86_64-linux-gnu",
                    "usr/lib/aarch64-linux-gnu",
                    "lib64",
                    "lib/x86_64-linux-gnu",
                    "lib/aarch64-linux-gnu",
                    "lib",
                    "usr/lib",
                )
            ),
            id="driver-root-every-layout-most-specific-first",
        ),
        pytest.param(
            NvmlLocation(driver_root="/host/driver", library="/usr/lib64/libnvidia-ml.so.580.95.05"),
            ("/host/driver/usr/lib64/libnvidia-ml.so.580.95.05",),
            id="named-library-is-within-the-root-even-when-absolute",
        ),
        pytest.param(
            NvmlLocation(driver_root="/host/driver", library="lib64/libnvidia-ml.so.1"),
            ("/host/driver/lib64/libnvidia-ml.so.1",),
            id="named-library-relative-to-the-root",
        ),
        pytest.param(
            NvmlLocation(library="/opt/nvidia/libnvidia-ml.so.1"),
            ("/opt/nvidia/libnvidia-ml.so.1",),
            id="named-library-without-a-root-is-a-container-path",
        ),
    ],
)
def test_candidates(location: NvmlLocation, expected: tuple[str, ...]) -> None:
    """The files tried, in order, for each way of naming where the driver is."""
    assert candidates(location) == expected


class FakePynvml:
    """What load_library touches of pynvml: its library global and the lock it loads under."""

    def __init__(self, loaded: Any = None) -> None:
        self.nvmlLib = loaded
        self.libLoadLock = threading.Lock()


class FakeLibrary:
    def __init__(self, name: str) -> None:
        self._name = name  # as ctypes.CDLL keeps it


def _opener(opened: list[str], refuse: dict[str, str] | None = None) -> Any:
    def open_library(path: str) -> FakeLibrary:
        opened.append(path)
        if refuse and path in refuse:
            raise OSError(f"{path}: {refuse[path]}")
        return FakeLibrary(path)

    return open_library


# The layouts of real driver installs, as files under a driver root.
@pytest.mark.parametrize(
    "layout",
    [
        pytest.param("usr/lib64", id="rhel-family-driver-container"),
        pytest.param("usr/lib/x86_64-linux-gnu", id="ubuntu-driver-container-or-host"),
        pytest.param("usr/lib/aarch64-linux-gnu", id="ubuntu-arm64"),
        pytest.param("lib64", id="gke-cos-installer"),
        pytest.param("lib", id="older-gke-installer"),
    ],
)
def test_a_driver_root_loads_the_library_of_its_layout(tmp_path: Path, layout: str) -> None:
    """The first layout that holds the file is opened by its full path, handed to pynvml and reported; the
    directories that do not hold it are not opened."""
    library = tmp_path / layout / LIBRARY_NAME
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    nv, opened = FakePynvml(), list[str]()

    loaded = load_library(nv, NvmlLocation(driver_root=str(tmp_path)), open_library=_opener(opened))

    assert loaded == str(library) and opened == [str(library)]
    assert nv.nvmlLib._name == str(library)
    assert not nv.libLoadLock.locked()


def test_a_file_that_does_not_load_is_skipped_with_its_reason(tmp_path: Path) -> None:
    """A library for another architecture under one layout: the next layout's is loaded."""
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64" / LIBRARY_NAME).write_bytes(b"")
    (tmp_path / "lib64").mkdir()
    (tmp_path / "lib64" / LIBRARY_NAME).write_bytes(b"")
    wrong = str(tmp_path / "usr/lib64" / LIBRARY_NAME)
    nv, opened = FakePynvml(), list[str]()

    loaded = load_library(
        nv, NvmlLocation(driver_root=str(tmp_path)), open_library=_opener(opened, {wrong: "wrong ELF class"})
    )

    assert loaded == str(tmp_path / "lib64" / LIBRARY_NAME) and opened == [wrong, loaded]


def test_a_library_pynvml_holds_already_is_kept(tmp_path: Path) -> None:
    """A second start in one process (the driver-limits programmer, `vramguard version`) opens nothing."""
    nv, opened = FakePynvml(FakeLibrary("/host/driver/lib64/libnvidia-ml.so.1")), list[str]()

    loaded = load_library(nv, NvmlLocation(driver_root=str(tmp_path)), open_library=_opener(opened))

    assert loaded == "/host/driver/lib64/libnvidia-ml.so.1" and opened == []


@pytest.mark.parametrize(
    ("location", "says"),
    [
        pytest.param(
            NvmlLocation(driver_root="{root}"),
            [
                "libnvidia-ml.so.1 was not found under the driver root {root}",
                "{root}/usr/lib64/libnvidia-ml.so.1: no such file",
                "{root}/lib64/libnvidia-ml.so.1: no such file",
                "{root}/usr/lib/libnvidia-ml.so.1: no such file",
                "driver.root",
                "driver.nvmlLibrary",
            ],
            id="driver-root-lists-every-layout-tried",
        ),
        pytest.param(
            NvmlLocation(driver_root="{root}", library="opt/libnvidia-ml.so.1"),
            ["{root}/opt/libnvidia-ml.so.1: no such file", "driver.nvmlLibrary"],
            id="named-library-says-the-file-and-the-value",
        ),
        pytest.param(
            LOADER_SEARCH,
            [
                "libnvidia-ml.so.1 was not found on the dynamic loader's search path",
                "libnvidia-ml.so.1: cannot open shared object file",
                "runtimeClassName: nvidia",
                "driver.root",
                "/run/nvidia/driver",
                "/home/kubernetes/bin/nvidia",
                "LD_LIBRARY_PATH",
            ],
            id="loader-search-names-the-runtime-and-the-values",
        ),
    ],
)
def test_where_nothing_loads_the_message_says_where_it_looked_and_what_to_set(
    tmp_path: Path, location: NvmlLocation, says: list[str]
) -> None:
    """NvmlUnavailable names each file tried with why it failed, and the chart value (and flag) to set."""
    root = str(tmp_path / "empty")
    location = NvmlLocation(location.driver_root.format(root=root), location.library)
    refuse = {LIBRARY_NAME: "cannot open shared object file: No such file or directory"}
    nv = FakePynvml()

    with pytest.raises(NvmlUnavailable) as raised:
        load_library(nv, location, open_library=_opener([], refuse))

    message = str(raised.value)
    assert message.startswith("NVML is not available: ")
    for part in says:
        assert part.format(root=root) in message
    assert nv.nvmlLib is None and not nv.libLoadLock.locked()


MAPS = """\
7f1c2a000000-7f1c2a100000 r--p 00000000 fd:01 1234  /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2b000000-7f1c2b200000 r-xp 00000000 fd:01 5678  /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05
7f1c2c000000-7f1c2c001000 rw-p 00000000 00:00 0
"""


@pytest.mark.parametrize(
    ("name", "maps", "expected"),
    [
        pytest.param(
            "/host/driver/lib64/libnvidia-ml.so.1", MAPS, "/host/driver/lib64/libnvidia-ml.so.1", id="a-path-is-itself"
        ),
        pytest.param(
            LIBRARY_NAME, MAPS, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05", id="loader-search-file-mapped"
        ),
        pytest.param(LIBRARY_NAME, "", LIBRARY_NAME, id="not-mapped-the-name"),
        pytest.param(LIBRARY_NAME, None, LIBRARY_NAME, id="no-maps-file-the-name"),
    ],
)
def test_loaded_path(tmp_path: Path, name: str, maps: str | None, expected: str) -> None:
    """Which file a library loaded by the loader's search is: the process's mapping of it."""
    maps_path = tmp_path / "maps"
    if maps is not None:
        maps_path.write_text(maps)
    assert loaded_path(name, str(maps_path)) == expected
