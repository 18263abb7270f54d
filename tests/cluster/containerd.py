"""A private containerd for the tests: its own config, root, state and socket under a work directory, so it never
meets a containerd the machine may run. The CRI settings are the ones a kubelet on this machine needs
(`docs/architecture.md` "A real node in tests"); images come from the image cache the project's scripts fill
(scripts/image.sh, scripts/node.sh), imported with `ctr`, never pulled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from types import TracebackType

from vramguard_testbed.waiting import WaitTimeout, wait_until

NAMESPACE = "k8s.io"  # the CRI's namespace: what the kubelet will see
IMAGES = Path(os.environ.get("VRAMGUARD_CACHE", Path.home() / ".cache" / "vramguard")) / "images"
PAUSE_IMAGE = "localhost/vramguard-pause:1"
# Where containerd 1.6's shims put their sockets and runc its state, whatever containerd's own state directory.
SHIM_DIR = Path("/run/containerd")

CONFIG = """\
version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # Root here lacks CAP_SYS_RESOURCE: without this runc fails to write /proc/self/oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"""


def unavailable_reason() -> str | None:
    """Why a containerd cannot be started here, or None."""
    for tool in ("containerd", "ctr", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (bash scripts/node.sh installs it)"
    if os.geteuid() != 0:
        return "containerd needs root"
    return None


class CtrFailed(subprocess.SubprocessError):
    """A ctr command failed; the message has what it said."""


class Containerd:
    """`with Containerd(workdir) as c:` starts containerd and waits for its socket; leaving stops every task it
    ran and containerd itself, and removes the shims' directory if it was not there before."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = workdir / "containerd.sock"
        self.log_path = workdir / "containerd.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._made_shim_dir = False

    def __enter__(self) -> Containerd:
        self._made_shim_dir = not SHIM_DIR.exists()
        root, state, cni = self.workdir / "root", self.workdir / "state", self.workdir / "cni"
        for d in (root, state, cni):
            d.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.toml"
        config.write_text(CONFIG.format(root=root, state=state, socket=self.socket, pause=PAUSE_IMAGE, cni=cni))
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        process = self._process

        def serving() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"containerd exited at start: see {self.log_path}")
            return self.ctr_status("version") == 0

        try:
            wait_until(serving, 30, what="containerd to answer", interval_s=0.1)
        except WaitTimeout:
            raise RuntimeError(f"containerd did not start: see {self.log_path}") from None
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            for task in self.ctr("task", "ls", "-q").split():
                self.ctr_status("task", "kill", "-s", "KILL", task)
                self.ctr_status("task", "delete", "--force", task)
            for container in self.ctr("container", "ls", "-q").split():
                self.ctr_status("container", "delete", container)
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._made_shim_dir:
            shutil.rmtree(SHIM_DIR, ignore_errors=True)

    def ctr(self, *args: str, timeout_s: float = 120) -> str:
        """ctr's output; CtrFailed with what it said on stderr when it fails."""
        done = subprocess.run(self._argv(args), capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise CtrFailed(f"ctr {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        return done.stdout

    def ctr_status(self, *args: str) -> int:
        return subprocess.run(self._argv(args), capture_output=True, timeout=60).returncode

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive))

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        return ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args]
