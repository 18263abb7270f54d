"""The agent's memory of the kills it made (`DecisionState.kills`), kept in the state directory so that an agent
restarted by its liveness probe or a rollout still knows a repeat when it sees one.

`<state dir>/kills.json`, written whole (a temporary file, then `os.replace`) when the kills change, read once at
start. Each entry names the container instance, when it was killed in, and the processes killed there (PID and
start time). The state directory is a hostPath that others may write, so the read trusts nothing: bounded in size,
opened without following a link or waiting on a FIFO, a file of the agent's own user that no one else may write,
every entry checked for shape (`parse_kills`) and then against what the node shows (`disagreement`). What is
restored is logged in one line, what is refused and why in another; nothing is raised. What the checks prove and
what they cannot: docs/architecture.md "Kills restored from the state directory".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

import structlog

from vramguard.base.logs import FailureRun
from vramguard.core.actions import KillRecord
from vramguard.core.process import ProcessRef
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, parse_cgroup
from vramguard.node.procfs import EXITED_STATES, boot_ticks, list_pids, read_cgroup, read_stat

FILE_NAME: Final = "kills.json"
FORMAT: Final = 2  # 1 (no "version"): container ID → time, without the processes killed
BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
MAX_ENTRIES: Final = 2048  # far more container instances than one node kills in within a repeat window
MAX_KILLED_SAVED: Final = 8  # per entry, the newest: "came back" is measured against the newest one killed
MAX_FILE_BYTES: Final = 1024 * 1024  # MAX_ENTRIES entries of the agent's own making, with room to spare
MAX_PROBLEMS_SHOWN: Final = 3
MAX_CONTAINERS_SHOWN: Final = 8
SHORT_ID: Final = 12  # a container ID as `crictl ps` shows it
PID_MAX_LIMIT: Final = 4 * 1024 * 1024  # the kernel's PID_MAX_LIMIT: no PID is above it

_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")  # the runtime IDs `cgroup` reads from container cgroups
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY

# Why an entry is refused (the log line's `problems`). Format 1 said when, not what: nothing in it can be checked.
OLD_FORMAT: Final = "format 1: no killed processes to check"
NO_PROCESS: Final = "names no killed process"
STARTS_LATER: Final = "a killed process that starts after now"
STILL_RUNNING: Final = "a killed process still running (never killed)"
PID_TAKEN: Final = "a killed PID held since before that process started"
UNREADABLE: Final = "a killed process that cannot be read"
OLDER_THAN_CONTAINER: Final = "killed processes all older than the container's first"


@dataclass(frozen=True, slots=True)
class Remembered:
    """What a kills file holds that can be used, and what was not."""

    kills: Mapping[str, KillRecord]
    # Each entry refused: the container ID (None when the key is not one) and why.
    refused: tuple[tuple[str | None, str], ...] = ()
    gone: tuple[str, ...] = ()  # container instances with no process left on the node: nothing to escalate
    other_boot: bool = False  # written before the node last booted: its container instances are gone

    @property
    def dropped(self) -> int:
        return len(self.refused)

    @property
    def problems(self) -> tuple[str, ...]:
        """The first few distinct reasons, in the order met (for the one log line)."""
        return tuple(dict.fromkeys(why for _, why in self.refused))[:MAX_PROBLEMS_SHOWN]


def parse_kills(data: bytes, boot_id: str, now: float) -> Remembered:
    """The kills a file's bytes hold, on the agent's clock at `now`, each `restored`. Never raises on content.

    Times are CLOCK_MONOTONIC seconds, which every process of one boot shares and no wall-clock step moves; so
    the file names its boot, and a file from an earlier boot is dropped whole (its container instances are gone).
    """
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return Remembered({}, ((None, "not JSON"),))
    if not isinstance(document, dict) or not isinstance(document.get("kills"), dict):
        return Remembered({}, ((None, "not an object with a kills object"),))
    if document.get("boot_id") != boot_id:
        return Remembered({}, other_boot=True)
    entries: dict[object, object] = document["kills"]
    version = document.get("version", 1)
    if version != FORMAT:
        why = OLD_FORMAT if version == 1 else f"an unknown format version: {str(version)[:20]!r}"
        return Remembered({}, tuple((_container_id(key), why) for key in entries))
    kills: dict[str, KillRecord] = {}
    refused: list[tuple[str | None, str]] = []
    for key, entry in entries.items():
        found = _record(key, entry, now)
        if isinstance(found, KillRecord) and len(kills) >= MAX_ENTRIES:
            found = f"more than {MAX_ENTRIES} entries"
        if isinstance(found, str):
            refused.append((_container_id(key), found))
            continue
        assert isinstance(key, str)
        kills[key] = found
    return Remembered(kills, tuple(refused))


def _container_id(key: object) -> str | None:
    return key if isinstance(key, str) and _CONTAINER_ID.fullmatch(key) else None


def _record(key: object, entry: object, now: float) -> KillRecord | str:
    """The entry as a record, or why it is refused."""
    if _container_id(key) is None:
        return "a key that is not a 64-hex container ID"
    if not isinstance(entry, dict):
        return "an entry that is not an object"
    at = entry.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return "a time that is not a number"
    if not 0 <= at <= now:
        return "a time outside this boot's past"
    killed = entry.get("killed")
    if not isinstance(killed, list) or not killed:
        return NO_PROCESS
    if len(killed) > MAX_KILLED_SAVED:
        return f"more than {MAX_KILLED_SAVED} killed processes"
    refs = []
    for item in killed:
        if not isinstance(item, list) or len(item) != 2 or not all(_is_int(x) for x in item):
            return "a killed process that is not [PID, start time]"
        pid, start_time = item
        if not 0 < pid <= PID_MAX_LIMIT or start_time < 0:
            return "a killed PID or start time out of range"
        refs.append(ProcessRef(pid, start_time))
    return KillRecord(at=float(at), killed=tuple(sorted(set(refs))), restored=True)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# --------------------------------------------------------------------------------------------------------------
# What the node shows


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the node shows that a remembered kill must agree with (`read_node`)."""

    now_ticks: int  # clock ticks since boot, now (the unit of a process's start time)
    running: Mapping[int, int]  # PID → start time of each process asked about that has not exited
    unreadable: frozenset[int]  # PIDs asked about whose state could not be read
    oldest: Mapping[str, int]  # container ID asked about → start time of its oldest process not exited (its init)


def read_node(
    proc_root: str,
    pids: Iterable[int],
    container_ids: Iterable[str],
    now_ticks: int,
    kubelet: KubeletTree = HOST_KUBELET,
) -> NodeView:
    """What `proc_root` shows of these PIDs and of these containers' processes (in the kubelet's tree), at
    `now_ticks` (clock ticks since boot, read before it: a process it sees started then or before). One pass over
    every process (a stat and a cgroup read each), once at start. Raises OSError when `proc_root` cannot be listed;
    a process that cannot be read is skipped (named in `unreadable` when it was asked about)."""
    wanted, containers = set(pids), set(container_ids)
    running: dict[int, int] = {}
    unreadable: set[int] = set()
    oldest: dict[str, int] = {}
    for pid in list_pids(proc_root):
        try:
            found = read_stat(pid, proc_root)
        except OSError:
            if pid in wanted:
                unreadable.add(pid)
            continue
        if found is None or found[0] in EXITED_STATES:
            continue
        start_time = found[1]
        if pid in wanted:
            running[pid] = start_time
        if containers and (cid := _container_of(pid, found, proc_root, kubelet)) in containers:
            assert cid is not None
            oldest[cid] = min(start_time, oldest.get(cid, start_time))
    return NodeView(now_ticks, running, frozenset(unreadable), oldest)


def _container_of(pid: int, stat: tuple[str, int], proc_root: str, kubelet: KubeletTree) -> str | None:
    """The container `pid` is in, when its cgroup can be read and still belongs to the process `stat` was read of."""
    try:
        text = read_cgroup(pid, proc_root)
        if text is None or read_stat(pid, proc_root) != stat:
            return None
    except OSError:
        return None
    identity = parse_cgroup(text, kubelet)
    return identity.container_id if identity is not None else None


GONE: Final = "gone"  # `disagreement`'s answer for a container instance with no process left: moot, not false


def disagreement(container_id: str, record: KillRecord, node: NodeView) -> str | None:
    """Why the node contradicts a remembered kill (one of the reasons above), `GONE` when its container instance
    has no process left, or None when nothing the node shows says it did not happen.

    A process the agent killed started before now, is not running now, and its PID was free when it started;
    it was a process of the container instance, so it started no earlier than that instance's first process
    (which lives as long as the instance). Start times are clock ticks since boot on both sides."""
    if not record.killed:
        return NO_PROCESS
    for ref in record.killed:
        if ref.start_time > node.now_ticks + 1:  # now and the start time round down to different ticks
            return STARTS_LATER
        running = node.running.get(ref.pid)
        if running == ref.start_time:
            return STILL_RUNNING
        if running is not None and running < ref.start_time:
            return PID_TAKEN
        if ref.pid in node.unreadable:
            return UNREADABLE
    first = node.oldest.get(container_id)
    if first is None:
        return GONE
    if max(r.start_time for r in record.killed) < first:
        return OLDER_THAN_CONTAINER
    return None


def checked(found: Remembered, node: NodeView) -> Remembered:
    """`found` with each entry the node contradicts refused, and each one whose container is gone set aside."""
    kills: dict[str, KillRecord] = {}
    refused = list(found.refused)
    gone: list[str] = []
    for container_id, record in found.kills.items():
        why = disagreement(container_id, record, node)
        if why is None:
            kills[container_id] = record
        elif why == GONE:
            gone.append(container_id)
        else:
            refused.append((container_id, why))
    return replace(found, kills=kills, refused=tuple(refused), gone=tuple(gone))


def short_ids(container_ids: Iterable[str | None]) -> list[str]:
    """At most MAX_CONTAINERS_SHOWN container IDs, each cut as `crictl ps` shows it, for a log line."""
    shown = [c[:SHORT_ID] for c in container_ids if c is not None]
    return shown[:MAX_CONTAINERS_SHOWN]


class KillFile:
    """`ports.KillMemory` in `<directory>/kills.json`, checked against `proc_root` when read. `save` runs on the
    scan, only after a kill: a few kilobytes at most into a new file of the agent's own (no fsync: losing the last
    kill to a power cut costs one plain kill)."""

    def __init__(
        self,
        directory: str,
        *,
        proc_root: str = "/proc",
        boot_id_path: str = BOOT_ID_PATH,
        now_ticks: Callable[[], int] = boot_ticks,
        log: structlog.typing.FilteringBoundLogger | None = None,
        kubelet: KubeletTree = HOST_KUBELET,
    ) -> None:
        """`now_ticks`: now in clock ticks since boot, as `proc_root`'s start times count (CLOCK_BOOTTIME);
        `kubelet`: where this node's kubelet makes pod cgroups."""
        self.directory = directory
        self.path = os.path.join(directory, FILE_NAME)
        self.proc_root = proc_root
        self.kubelet = kubelet
        self.now_ticks = now_ticks
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.boot_id = _read_boot_id(boot_id_path)
        self._failures = FailureRun()

    def load(self, now: float) -> Mapping[str, KillRecord]:
        """The kills an earlier agent of this boot remembered that the node does not contradict, each `restored`;
        {} when there is no file, or nothing usable in it. One line says what was restored, one what was refused."""
        try:
            data = _read_bounded(self.path)
        except FileNotFoundError:
            return {}
        except (OSError, _Refused) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self.log.warning("kill_memory_refused", file=self.path, refused="all", problems=[reason])
            return {}
        found = parse_kills(data, self.boot_id, now)
        if found.other_boot:
            self.log.info("kill_memory_from_another_boot", file=self.path)
            return {}
        if found.kills:
            found = self._check(found)
        if found.kills or found.gone:
            self.log.info(
                "kill_memory_restored",
                file=self.path,
                restored=len(found.kills),
                containers=short_ids(found.kills),
                gone=len(found.gone),  # container instances no longer on the node: nothing to escalate there
            )
        if found.refused:
            self.log.warning(
                "kill_memory_refused",
                file=self.path,
                refused=found.dropped,
                kept=len(found.kills),
                containers=short_ids(c for c, _ in found.refused),
                problems=found.problems,
            )
        return found.kills

    def _check(self, found: Remembered) -> Remembered:
        pids = {r.pid for record in found.kills.values() for r in record.killed}
        try:
            node = read_node(self.proc_root, pids, found.kills, self.now_ticks(), self.kubelet)
        except OSError as e:
            why = f"cannot read {self.proc_root}: {e.strerror or e}"
            return replace(found, kills={}, refused=(*found.refused, *((c, why) for c in found.kills)))
        return checked(found, node)

    def save(self, kills: Mapping[str, KillRecord]) -> None:
        """Replace the file with `kills` (the newest MAX_ENTRIES, each with its newest MAX_KILLED_SAVED processes);
        a failure is logged once per run of them."""
        newest = sorted(kills.items(), key=lambda kv: kv[1].at)[-MAX_ENTRIES:]
        entries = {
            container_id: {
                "at": record.at,
                "killed": [[r.pid, r.start_time] for r in _newest_killed(record.killed)],
            }
            for container_id, record in newest
        }
        document = {"version": FORMAT, "boot_id": self.boot_id, "kills": entries}
        body = json.dumps(document, separators=(",", ":")).encode()
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


def _newest_killed(killed: Iterable[ProcessRef]) -> list[ProcessRef]:
    return sorted(sorted(killed, key=lambda r: r.start_time)[-MAX_KILLED_SAVED:])


class _Refused(Exception):
    """The path is not a file the agent could have written."""


def _read_bounded(path: str) -> bytes:
    fd = os.open(path, _READ)  # a link is refused (ELOOP); a FIFO opens at once and is refused below
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused("not a regular file")
        if st.st_uid != os.geteuid():
            raise _Refused(f"owned by UID {st.st_uid}, not the agent's")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise _Refused("writable by others than its owner")
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
