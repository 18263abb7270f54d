"""The test node's container runtime on its own: a private containerd runs the project's own images (the agent's,
built from the Dockerfile, and the pod sandbox's pause), imported from the image cache, never pulled."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from real_parts import need
from vramguard import __version__
from vramguard_testbed.waiting import wait_until

from .containerd import IMAGES, PAUSE_IMAGE, Containerd, unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.real_node]


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Containerd]:
    reason = unavailable_reason()
    if reason is None and not (IMAGES / "pause-1.tar").exists():
        reason = f"no pause image in {IMAGES} (bash scripts/node.sh builds it)"
    need(reason, skip="no test node", ci="prepare the test node first (bash scripts/node.sh)")
    # A short path: the socket's must fit in sun_path.
    workdir = Path(f"/tmp/vg-ctrd-{os.getpid()}-{time.monotonic_ns() % 10**6}")
    try:
        with Containerd(workdir) as c:
            yield c
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_agents_image_runs_in_containerd(containerd: Containerd) -> None:
    archive = IMAGES / f"vramguard-{__version__}.tar"
    if not archive.exists():
        pytest.fail(f"{archive} is missing: bash scripts/image.sh builds it", pytrace=False)
    containerd.import_image(archive)
    out = containerd.ctr(
        "run", "--rm", f"localhost/vramguard:{__version__}", "agent-version", "vramguard", "version", "--json"
    )
    assert json.loads(out)["vramguard"] == __version__


def test_the_pause_image_runs_and_stops_on_term(containerd: Containerd) -> None:
    containerd.import_image(IMAGES / "pause-1.tar")
    containerd.ctr("run", "--detach", PAUSE_IMAGE, "sandbox")
    pid = int(next(line.split()[1] for line in containerd.ctr("task", "ls").splitlines() if line.startswith("sandbox")))
    assert Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0") == b"/pause"
    assert Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0] == "65535"
    containerd.ctr("task", "kill", "--signal", "TERM", "sandbox")
    wait_until(lambda: "RUNNING" not in containerd.ctr("task", "ls"), 10, what="the sandbox to stop", interval_s=0.05)
    assert "STOPPED" in containerd.ctr("task", "ls"), "pause exits on SIGTERM, as a sandbox must"
