"""The layout is the architecture: packages by floor, imports only downwards, no two modules with one name, and
unit tests that mirror the modules they test (README "Layout")."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "vramguard"
UNIT = ROOT / "tests" / "unit"

# A package imports only from packages on lower floors (and from itself). The top-level modules are the package's
# version and `python -m vramguard`.
FLOORS = {
    "core": 1,
    "base": 2,
    "nvml": 3,
    "node": 3,
    "kube": 3,
    "agent": 4,
    "http": 5,
    "cli": 6,
    "plugin": 6,
}
TOP_LEVEL = {"__init__": 0, "__main__": 7}
# The decision core runs no I/O of its own: none of these in core/ (it parses bytes it is given).
IO_MODULES = {"os", "socket", "subprocess", "threading", "select", "selectors", "pynvml", "kubernetes", "psutil"}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    found: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        found[".".join(parts)] = path
    return found


def floor(module: str) -> int:
    parts = module.split(".")
    return TOP_LEVEL[parts[1]] if parts[1] in TOP_LEVEL else FLOORS[parts[1]]


def imports(path: Path) -> set[str]:
    """The modules `path` imports (absolute; the package uses no relative imports)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            found.add(node.module or "")
    return found


def test_every_package_has_a_floor() -> None:
    """A new package is placed on a floor before it is used (the table above and README's)."""
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(FLOORS)


def test_imports_only_go_down_a_floor() -> None:
    """No module imports from its own floor's other packages or from a floor above: the core imports no adapter."""
    wrong = []
    for name, path in modules().items():
        package = name.split(".")[1] if name.count(".") >= 2 else None
        for imported in imports(path):
            if not imported.startswith("vramguard.") or imported.count(".") < 1:
                continue
            target = imported.split(".")[1]
            if target == package or target in TOP_LEVEL:
                continue
            if floor(imported) >= floor(name) and imported not in ("vramguard",):
                wrong.append(f"{name} (floor {floor(name)}) imports {imported} (floor {floor(imported)})")
    assert wrong == []


def test_the_core_does_no_io() -> None:
    """core/ imports no I/O library: it is pure, so its tests need nothing but constructors."""
    wrong = [
        f"{name} imports {imported}"
        for name, path in modules().items()
        if name.startswith("vramguard.core.")
        for imported in imports(path)
        if imported.split(".")[0] in IO_MODULES
    ]
    assert wrong == []


def test_no_two_modules_share_a_name() -> None:
    """A module's name says which one it is: no `limits`, `limiter` and `nvml/limits` to open all three."""
    by_stem: dict[str, list[str]] = defaultdict(list)
    for name in modules():
        stem = name.rsplit(".", 1)[1]
        if not stem.startswith("__"):
            by_stem[stem].append(name)
    assert {stem: names for stem, names in by_stem.items() if len(names) > 1} == {}


@pytest.mark.parametrize("test_file", sorted(UNIT.glob("*/test_*.py")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_unit_test_files_mirror_modules(test_file: Path) -> None:
    """tests/unit/<package>/test_<module>.py tests src/vramguard/<package>/<module>.py."""
    module = SRC / test_file.parent.name / (test_file.name.removeprefix("test_"))
    assert module.exists(), f"{test_file.relative_to(ROOT)} names no module: {module.relative_to(ROOT)} is missing"


# The one background-loop primitive, and the one thread that must be abandoned rather than joined: a call hung in
# the GPU driver (README "Layout").
THREAD_OWNERS = {"vramguard.base.background", "vramguard.nvml.deadline"}


def test_every_thread_is_a_background_loop() -> None:
    """`threading.Thread(` appears only in the loop primitive and the NVML deadline runner."""
    starters = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            called = node.func if isinstance(node, ast.Call) else None
            if (isinstance(called, ast.Attribute) and called.attr == "Thread") or (
                isinstance(called, ast.Name) and called.id == "Thread"
            ):
                starters.add(name)
    assert starters == THREAD_OWNERS
