"""The health file: the agent's liveness and readiness, written where the kubelet's exec probe reads them.

No network reaches it, so nothing a tenant can connect to shares a queue with the kubelet's view of the agent
(docs/architecture.md "Liveness and readiness without a port"). The agent writes the file whole every `WRITE_EVERY_S`
(`agent.health.HealthWriter`), `vramguard-probe live|ready` (`cli/probe.py`) reads it. A file older than
`STALE_AFTER_S` says the writer has stopped making progress: the probe then fails whatever the file holds.

The probe is a process the kubelet starts every period, so its start-up is its whole cost: this module imports
`os` alone (which the interpreter has loaded already), and the file is lines of `field value`, not JSON (the json
module brings `re`). Measured: an interpreter that only starts, 27 ms; with json and the `re` it loads, 51 ms; with
dataclasses and enum, 90 ms (20 runs each, on this project's 2-core build machine under load).
"""

from __future__ import annotations

import os

DEFAULT_PATH = "/run/vramguard/health"
WRITE_EVERY_S = 1.0
# Ten missed writes: a node so starved of CPU that the writer's thread cannot run for ten seconds, or an agent
# whose interpreter has stopped. The kubelet restarts it only after `failureThreshold` such answers.
STALE_AFTER_S = 10.0
MAX_FILE_BYTES = 8 * 1024  # two reasons of MAX_WHY_CHARS, four bytes a character, and the rest
MAX_WHY_CHARS = 1000
LIVE = "live"
READY = "ready"
PROBES = (LIVE, READY)

_MAGIC = "vramguard-health 1"
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY

Check = tuple[bool, str]
"""One probe's answer: whether it passes, and why (what the kubelet records when it does not)."""


class HealthDocument:
    """What the agent says of itself at `written_at` (CLOCK_MONOTONIC seconds, which every process of one boot
    shares, so the probe can tell how old it is). A plain slotted class, not a dataclass: see the module's
    docstring."""

    __slots__ = ("live", "pid", "ready", "written_at")

    def __init__(self, written_at: float, pid: int, live: Check, ready: Check) -> None:
        self.written_at = written_at
        self.pid = pid
        self.live = live
        self.ready = ready

    def check(self, probe: str) -> Check:
        return self.live if probe == LIVE else self.ready

    def _fields(self) -> tuple[float, int, Check, Check]:
        return self.written_at, self.pid, self.live, self.ready

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HealthDocument) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable in principle: compared, never hashed

    def __repr__(self) -> str:
        return f"HealthDocument(written_at={self.written_at!r}, pid={self.pid}, live={self.live}, ready={self.ready})"


class HealthFileError(Exception):
    """The health file is missing, unreadable or not one the agent wrote; the message says which, for the probe's
    output."""


def _one_line(why: str) -> str:
    return " ".join(why.split())[:MAX_WHY_CHARS]


def encode(document: HealthDocument) -> bytes:
    lines = [_MAGIC, f"written_at {document.written_at!r}", f"pid {document.pid}"]
    lines += [f"{p} {'ok' if ok else 'failing'} {_one_line(why)}" for p in PROBES for ok, why in [document.check(p)]]
    return ("\n".join(lines) + "\n").encode("utf-8", "replace")


def decode(data: bytes) -> HealthDocument:
    """The document in `data`; raises HealthFileError naming the field and value that are wrong."""
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if lines[0] != _MAGIC:
        raise HealthFileError(f"first line: {_shown(lines[0])}, expected {_MAGIC!r}")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(" ")
        if name:
            fields.setdefault(name, value)
    written_at = _number(fields, "written_at")
    pid_text = fields.get("pid", "")
    if not pid_text.isdecimal() or int(pid_text) < 1:
        raise HealthFileError(f"pid: {_shown(pid_text)} is not a PID")
    live, ready = (_check(fields, p) for p in PROBES)
    return HealthDocument(written_at, int(pid_text), live, ready)


def _number(fields: dict[str, str], name: str) -> float:
    try:
        value = float(fields.get(name, ""))
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")):
        raise HealthFileError(f"{name}: {_shown(fields.get(name))} is not a time")
    return value


def _check(fields: dict[str, str], probe: str) -> Check:
    state, _, why = fields.get(probe, "").partition(" ")
    if state not in ("ok", "failing"):
        raise HealthFileError(f"{probe}: {_shown(fields.get(probe))} is not 'ok' or 'failing' and a reason")
    return state == "ok", why[:MAX_WHY_CHARS]


def _shown(value: object) -> str:
    return repr(value)[:64]


def verdict(document: HealthDocument, probe: str, now: float, stale_after_s: float = STALE_AFTER_S) -> Check:
    """The probe's answer at `now` (CLOCK_MONOTONIC): the agent's own, unless the file is too old to believe."""
    age_s = now - document.written_at
    if age_s > stale_after_s:
        return False, f"the agent (PID {document.pid}) last wrote its health {age_s:.1f} s ago: it is stuck"
    if age_s < -stale_after_s:
        return False, f"the health file is dated {-age_s:.1f} s ahead of this clock: not written in this boot"
    return document.check(probe)


def read(path: str) -> bytes:
    """The file's bytes, without following a link, waiting on a FIFO or reading past MAX_FILE_BYTES; raises
    HealthFileError saying why not."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        raise HealthFileError(f"no health file at {path}: the agent has not started, or cannot write there") from None
    except OSError as e:
        raise HealthFileError(f"cannot open {path}: {e.strerror or e}") from None
    try:
        if not _is_regular(os.fstat(fd).st_mode):
            raise HealthFileError(f"{path} is not a regular file")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as e:
        raise HealthFileError(f"cannot read {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise HealthFileError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    return data


def _is_regular(mode: int) -> bool:
    return mode & 0o170000 == 0o100000  # stat.S_ISREG, without importing stat for it
