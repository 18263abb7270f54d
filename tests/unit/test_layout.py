"""The layout is the architecture: packages by floor, imports only downwards, no two modules with one name, a unit
test file for every module and none for a module that is not there, and docs that name modules which exist
(CONTRIBUTING.md "Layout")."""

from __future__ import annotations

import ast
import functools
import re
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


@functools.cache
def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of `path`'s syntax tree, parsed and walked once for all the tests that read it: that is most of
    their time, and nothing changes the files while the tests run."""
    return tuple(ast.walk(ast.parse(path.read_text())))


def imports(path: Path) -> set[str]:
    """The modules `path` imports (absolute; the package uses no relative imports)."""
    found: set[str] = set()
    for node in nodes(path):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            found.add(node.module or "")
    return found


def test_every_package_has_a_floor() -> None:
    """A new package is placed on a floor before it is used (the table above and CONTRIBUTING.md's)."""
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


def test_no_module_imports_itself_back() -> None:
    """The imports between modules form no cycle, those made for type checking alone included: a module that needs
    another's types and is needed by it means one idea is split across two modules (`core/ports` and
    `core/limit_plan` were one such pair, until the limit's types moved to `core/driver_limit`)."""
    found = modules()
    graph = {name: {i for i in imports(path) if i in found and i != name} for name, path in found.items()}
    cycles: list[list[str]] = []
    done: set[str] = set()

    def walk(name: str, path: list[str]) -> None:
        for nxt in sorted(graph[name]):
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                walk(nxt, [*path, nxt])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            walk(name, [name])
    assert [" -> ".join(c) for c in cycles] == []


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


@pytest.mark.parametrize(
    "module",
    sorted(p for p in SRC.glob("*/*.py") if not p.stem.startswith("__")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_module_has_a_unit_test_file(module: Path) -> None:
    """src/vramguard/<package>/<module>.py has tests/unit/<package>/test_<module>.py, for its pure logic at least
    (what needs the OS or NVML is tested in tests/node as well): no allow-list."""
    test_file = UNIT / module.parent.name / f"test_{module.name}"
    assert test_file.exists(), f"{module.relative_to(ROOT)} has no unit test file: {test_file.relative_to(ROOT)}"


DOCS = (ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")))
# `vramguard.a.b…` (a module, or a name in one), not a file such as vramguard.yaml nor a resource name such as
# vramguard.io/vram; `core/quota.py` and `src/vramguard/core/quota.py`.
DOTTED = re.compile(r"\bvramguard(?:\.[A-Za-z_]\w*)+(?![\w/-])")
FILE_SUFFIXES = {"yaml", "yml", "json", "md", "toml", "txt", "sh", "log"}
SLASHED = re.compile(rf"(?<![\w/.-])(?:src/vramguard/)?(?:{'|'.join(FLOORS)})/\w+\.py\b")


def named_modules(text: str) -> set[str]:
    """The package paths `text` names, each as the path it stands for under src/ (`vramguard/core/quota`)."""
    found = {
        m.group(0).replace(".", "/") for m in DOTTED.finditer(text) if m.group(0).rsplit(".", 1)[1] not in FILE_SUFFIXES
    }
    found |= {
        "vramguard/" + m.group(0).removeprefix("src/vramguard/").removesuffix(".py") for m in SLASHED.finditer(text)
    }
    return found


def is_module(path: str) -> bool:
    """A package or module, or a name defined in one (`vramguard/node/cgroup/v2_root`): each part below a package is
    a package or module in it, or a name its `__init__` holds; the first part below a module is a name it holds."""
    where = SRC.parent / "vramguard"
    for part in path.split("/")[1:]:
        if (where / part / "__init__.py").exists():
            where = where / part
        elif (where / f"{part}.py").exists():
            where = where / f"{part}.py"
        else:
            source = where / "__init__.py" if where.is_dir() else where
            return re.search(rf"\b{part}\b", source.read_text()) is not None
    return True


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_name_real_modules(doc: Path) -> None:
    """Every `vramguard.x.y` and `x/y.py` the README, CONTRIBUTING.md and docs/ name is a module of the package (or a
    name in one)."""
    assert sorted(p for p in named_modules(doc.read_text()) if not is_module(p)) == []


def test_a_stale_module_name_is_caught() -> None:
    """The check above sees dotted and slashed names, and lets files and resource names be."""
    named = named_modules(
        "`vramguard.dra`, `core/gone.py`, `vramguard.node.cgroup.v2_root`, `vramguard.node.cgroup.no_such_name`, "
        "vramguard.yaml, vramguard.io/vram, `node/kill.py`, `src/vramguard/core/quota.py`, `vramguard.nvml`"
    )
    assert {p for p in named if not is_module(p)} == {
        "vramguard/dra",
        "vramguard/core/gone",
        "vramguard/node/cgroup/no_such_name",
    }
    assert "vramguard/core/quota" in named


# The one background-loop primitive, and the one thread that must be abandoned rather than joined: a call hung in
# the GPU driver (CONTRIBUTING.md "Layout").
THREAD_OWNERS = {"vramguard.base.background", "vramguard.nvml.deadline"}


def test_every_thread_is_a_background_loop() -> None:
    """`threading.Thread(` appears only in the loop primitive and the NVML deadline runner."""
    starters = set()
    for name, path in modules().items():
        for node in nodes(path):
            called = node.func if isinstance(node, ast.Call) else None
            if (isinstance(called, ast.Attribute) and called.attr == "Thread") or (
                isinstance(called, ast.Name) and called.id == "Thread"
            ):
                starters.add(name)
    assert starters == THREAD_OWNERS
