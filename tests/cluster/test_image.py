"""The agent's image, as scripts/image.sh builds it from the Dockerfile with buildah (scripts/test.sh runs it
first): it runs the agent, as the Dockerfile says, and holds nothing of the test bench."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from real_parts import need
from vramguard import __version__

IMAGE = f"localhost/vramguard:{__version__}"
BENCH = ("vramguard_testbed", "controlplane", "simnode", "fakenvml", "fake_nvml", "cgroups.py", "demo.py")


def _buildah(*args: str) -> str:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, check=True, timeout=120).stdout


@pytest.fixture(scope="module")
def image() -> dict[str, Any]:
    reason = None
    if shutil.which("buildah") is None:
        reason = "buildah is not installed"
    elif subprocess.run(["buildah", "inspect", "--type", "image", IMAGE], capture_output=True).returncode != 0:
        reason = f"{IMAGE} is not built"
    need(reason, skip="no agent image (bash scripts/image.sh builds it)", ci="build the image first")
    inspected: dict[str, Any] = json.loads(_buildah("inspect", "--type", "image", IMAGE))
    return inspected


@pytest.fixture(scope="module")
def root(image: dict[str, Any]) -> Iterator[Path]:
    """The image's filesystem, mounted read-only through a working container."""
    container = _buildah("from", "--pull-never", IMAGE).strip()
    try:
        yield Path(_buildah("mount", container).strip())
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, timeout=60)


def test_image_runs_the_agent_as_the_dockerfile_says(image: dict[str, Any]) -> None:
    config = image["OCIv1"]["config"]
    assert config["Entrypoint"] == ["vramguard"] and config["Cmd"] == ["run"]
    assert config["User"] == "65532:65532", "non-root unless the DaemonSet says otherwise"


def test_the_agent_in_the_image_starts(image: dict[str, Any]) -> None:
    container = _buildah("from", "--pull-never", IMAGE).strip()
    try:
        out = _buildah("run", "--isolation", "chroot", container, "--", "vramguard", "version", "--json")
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, timeout=60)
    assert json.loads(out)["vramguard"] == __version__


def test_image_holds_the_agent_and_no_bench(root: Path) -> None:
    (package,) = [p for p in root.glob("usr/local/lib/python3*/*-packages/vramguard") if p.is_dir()]
    shipped = {str(p.relative_to(package)) for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    source = Path(__file__).resolve().parents[2] / "src" / "vramguard"
    expected = {str(p.relative_to(source)) for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert shipped == expected
    site = package.parent
    assert not [p.name for p in site.iterdir() if p.name.startswith("vramguard_testbed")]
    for path in site.rglob("*"):
        if "vramguard" in path.parts:
            assert not path.name.endswith((".c", ".h")), path
            assert not any(name in path.name for name in BENCH), path
