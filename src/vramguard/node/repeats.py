"""The agent's memory of the container instances it killed in (`DecisionState.kills`), kept in the state directory
so that an agent restarted by its liveness probe or a rollout still knows a repeat when it sees one.

`<state dir>/kills.json`, written whole (a temporary file, then `os.replace`) when the kills change, read once at
start. The state directory is a hostPath that others may write, so the read trusts nothing: bounded in size,
opened without following a link or waiting on a FIFO, every entry checked (a container ID as the agent records
them, a sane time), and whatever is junk dropped and reported in one log line, never raised.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import structlog

from vramguard.base.logs import FailureRun

FILE_NAME: Final = "kills.json"
BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
MAX_ENTRIES: Final = 2048  # far more container instances than one node kills in within a repeat window
MAX_FILE_BYTES: Final = 256 * 1024  # MAX_ENTRIES entries of the agent's own making, with room to spare
MAX_PROBLEMS_SHOWN: Final = 3

_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")  # the runtime IDs `cgroup` reads from container cgroups
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


@dataclass(frozen=True, slots=True)
class Remembered:
    """What a kills file holds that can be used, and what was wrong with the rest."""

    kills: Mapping[str, float]
    dropped: int = 0  # entries refused
    problems: tuple[str, ...] = ()  # the first few reasons, for the one log line
    other_boot: bool = False  # written before the node last booted: its container instances are gone


def parse_kills(data: bytes, boot_id: str, now: float) -> Remembered:
    """The kills a file's bytes hold, on the agent's clock at `now`. Never raises on content.

    Times are CLOCK_MONOTONIC seconds, which every process of one boot shares and no wall-clock step moves; so
    the file names its boot, and a file from an earlier boot is dropped whole (its container instances are gone).
    """
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return Remembered({}, 1, ("not JSON",))
    if not isinstance(document, dict) or not isinstance(document.get("kills"), dict):
        return Remembered({}, 1, ("not an object with a kills object",))
    if document.get("boot_id") != boot_id:
        return Remembered({}, other_boot=True)
    kills: dict[str, float] = {}
    problems: list[str] = []
    entries = document["kills"]
    for container_id, killed_at in entries.items():
        problem = _problem(container_id, killed_at, now)
        if problem is None and len(kills) >= MAX_ENTRIES:
            problem = f"more than {MAX_ENTRIES} entries"
        if problem is not None:
            problems.append(problem)
            continue
        kills[container_id] = float(killed_at)
    shown = tuple(dict.fromkeys(problems))[:MAX_PROBLEMS_SHOWN]  # distinct reasons, in the order met
    return Remembered(kills, len(problems), shown)


def _problem(container_id: str, killed_at: object, now: float) -> str | None:
    if not _CONTAINER_ID.fullmatch(container_id):
        return "a key that is not a 64-hex container ID"
    if isinstance(killed_at, bool) or not isinstance(killed_at, (int, float)) or not math.isfinite(killed_at):
        return "a time that is not a number"
    if not 0 <= killed_at <= now:
        return "a time outside this boot's past"
    return None


class KillFile:
    """`ports.KillMemory` in `<directory>/kills.json`. `save` runs on the scan, only after a kill: a few hundred
    bytes into a new file of the agent's own (no fsync: losing the last kill to a power cut costs one plain kill)."""

    def __init__(
        self,
        directory: str,
        *,
        boot_id_path: str = BOOT_ID_PATH,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.directory = directory
        self.path = os.path.join(directory, FILE_NAME)
        self.log = log if log is not None else structlog.get_logger("vramguard.node.repeats")
        self.boot_id = _read_boot_id(boot_id_path)
        self._failures = FailureRun()

    def load(self, now: float) -> Mapping[str, float]:
        """The kills an earlier agent of this boot remembered; {} when there is no file, or nothing usable in it."""
        try:
            data = _read_bounded(self.path)
        except FileNotFoundError:
            return {}
        except (OSError, _Refused) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self.log.warning("kill_memory_junk", file=self.path, dropped="all", problems=[reason])
            return {}
        found = parse_kills(data, self.boot_id, now)
        if found.dropped:
            self.log.warning(
                "kill_memory_junk",
                file=self.path,
                dropped=found.dropped,
                kept=len(found.kills),
                problems=found.problems,
            )
        elif found.other_boot:
            self.log.info("kill_memory_from_another_boot", file=self.path)
        return found.kills

    def save(self, kills: Mapping[str, float]) -> None:
        """Replace the file with `kills` (the newest MAX_ENTRIES); a failure is logged once per run of them."""
        newest = dict(sorted(kills.items(), key=lambda kv: kv[1])[-MAX_ENTRIES:])
        body = json.dumps({"boot_id": self.boot_id, "kills": newest}, separators=(",", ":")).encode()
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{FILE_NAME}.", suffix=".tmp")  # O_EXCL, 0600
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                os.replace(tmp, self.path)  # a rename replaces a planted link itself, never what it points to
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as e:
            error = e.strerror or repr(e)
            if self._failures.failed(error):
                self.log.warning("kill_memory_unsaved", file=self.path, error=error)
            return
        if self._failures.ok():
            self.log.info("kill_memory_saved", file=self.path)


class _Refused(Exception):
    """The path is not a file the agent could have written."""


def _read_bounded(path: str) -> bytes:
    fd = os.open(path, _READ)  # a link is refused (ELOOP); a FIFO opens at once and is refused below
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Refused("not a regular file")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 65536):
            size += len(chunk)
            if size > MAX_FILE_BYTES:
                raise _Refused(f"larger than {MAX_FILE_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_boot_id(path: str) -> str:
    """This boot's ID, or "" where it cannot be read (then a file of another boot is not told apart: its container
    IDs are of instances that no longer exist, so no violation matches them)."""
    try:
        with open(path, "rb") as f:
            text = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if _BOOT_ID.fullmatch(text) else ""
