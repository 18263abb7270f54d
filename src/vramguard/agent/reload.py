"""The policy file (or a policy ConfigMap's directory, every key of it), watched: an edit, or the kubelet's swap of
a ConfigMap volume (`..data` renamed onto a new `..<timestamp>` directory), is read, checked and put through the
flags' overrides on a thread of its own, and handed to the scan loop ready; the loop swaps it in at the start of its
next scan (`Agent.scan`) and never waits on the file.

Detection is a poll: every `CHECK_INTERVAL_S` the file (or each key of the ConfigMap, below its `..data`) is read
through its links (`base.policyfile`: regular files only, opened without blocking, 1 MiB at most as a ConfigMap)
and hashed, and parsed only when the hash is not
the one seen last. Reading whole each time, rather than trusting a stat, sees an edit in place that keeps
the size within one mtime tick, and the kubelet's swap alike (`..data` renamed onto a new directory: an open
through the links gets one whole version or the other).

A policy is put in force only when it is whole, as far as a reader can tell. A file other than the last one read
(its device and inode, from the open file, or of a ConfigMap's version directory: a rename over the path, the
kubelet's swap) was whole before it
appeared, and is parsed at once. A file changed in place may be a writer halfway, and a half that parses is a
policy (a list cut before its last entry): its content is parsed only once it has stayed the same for an interval
(on the injected clock), so an edit in place costs one interval more. A writer that stalls halfway for longer looks
finished: no reader can tell, which is why the docs say to write a file whole and rename it over the path.

An invalid policy is refused: the last good one stays in force, the log says why once per distinct content, and
`invalid` (the metric, /status) says so until the file is good again. What is never a policy file (a FIFO, which
would block the read; a device, which may never end; a socket, a directory that holds no policy.yaml, more than
1 MiB) is refused at once,
in the same way, once per run of one cause. A file that cannot be read (gone mid-swap) is tried again soon, and
reported only when that keeps failing.

Some fields built parts at start that a reload cannot build (`fit`): those take effect after a restart, and the
agent says so; everything else is in force from the next scan.

Each part that holds policy registers its apply function (`PolicyReloader.register`, as Prometheus' reloaders each
register `ApplyConfig`); at the start of a scan, on the scan loop's thread, `apply_pending` fits the policy read and
calls them in the order they registered, then counts the reload once, where refusals are counted too.
"""

from __future__ import annotations

import enum
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from vramguard.base.background import BackgroundLoop
from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.base.policyfile import FileRefused, read_policy_file
from vramguard.core.limit_plan import uses_limiter
from vramguard.core.policy import Policy, PolicyError, policy_from_text
from vramguard.core.sources import reads_claims

# How often the file is read and hashed (parsed only when the hash changed). The kubelet's ConfigMap sync (about a
# minute by default) is most of the time from `kubectl apply` to the new policy in force.
CHECK_INTERVAL_S = 2.0
# Reads that fail in a row before the file is reported unreadable: one failure is a swap caught mid-way.
UNREADABLE_AFTER = 3
# The fields whose change needs a part built at start (`fit`), as the metric's `field` label names them.
RESTART_FIELDS = ("quota_sources", "driver_limits", "watch_interval")


class ReloadResult(str, enum.Enum):
    """What a change of the policy file came to: the `result` label of vramguard_policy_reloads_total, each exported
    at 0 from the start."""

    APPLIED = "applied"  # in force from the next scan (counted once every holder has it: `apply_pending`)
    # refused, once per distinct content (or a run of one cause: not a regular file, over 1 MiB, unreadable): the
    # last good policy stays in force
    INVALID = "invalid"


def digest_of(text: bytes) -> str:
    """The content's identity, as the log and /status show it."""
    return hashlib.sha256(text).hexdigest()


@dataclass(frozen=True, slots=True)
class Loaded:
    """A reloaded policy, checked and with the flags' overrides applied, and the hash of the file's content."""

    policy: Policy
    digest: str


@dataclass(frozen=True, slots=True)
class InForce:
    """The policy in force, the hash of the file's content it was read from (None: no policy file), and the fields
    of the file that wait for a restart (`fit`): what every part that holds policy is handed at a reload."""

    policy: Policy
    digest: str | None = None
    restart_needed: tuple[str, ...] = ()


# A part's apply function: it takes the policy in force from the scan under way on (on the scan loop's thread).
ApplyPolicy = Callable[[InForce], None]


@dataclass(frozen=True, slots=True)
class Built:
    """What the agent built at start from its first policy, which a reload cannot add."""

    claims: bool  # a claim source (a `claim:` quota source)
    limiter: bool  # the driver-limits programmer
    watch: bool  # the watch between scans
    dry_run: bool


def fit(new: Policy, built: Built, running: Policy) -> tuple[Policy, tuple[str, ...]]:
    """The policy to put in force for `new`, and the fields that take effect only after a restart because the
    part they need was not built: those keep what `running` does. A part built but no longer wanted idles (a
    limiter clears the limits it holds; a claim source's shares go unread), except the watch, which keeps its
    interval until a restart: it may only ever scan more, never less."""
    restart: list[str] = []
    if reads_claims(new.quota_sources) and not built.claims:
        restart.append("quota_sources")
        new = replace(new, quota_sources=running.quota_sources)
    if uses_limiter(new, built.dry_run) and not built.limiter:
        restart.append("driver_limits")  # the reactive modes enforce every quota meanwhile
    if (new.watch_interval_s > 0) != built.watch:
        restart.append("watch_interval")
        new = replace(new, watch_interval_s=running.watch_interval_s)
    return new, tuple(restart)


class PolicyReloader:
    """Reads the policy file every `interval_s` from `start()` to `stop(deadline)`; `take()` hands over the latest
    good policy not taken yet, and `apply_pending` (the scan loop's, once a scan) puts it in force in every part
    registered as holding policy (`register`). `overrides` puts it through the flags (`Overrides.apply`); `digest`
    is the hash of the content the agent started with, `policy` the policy it started with; `count` hears each
    change's result, and `report_restarts` the fields waiting for a restart at each reload."""

    def __init__(
        self,
        path: str | Path,
        overrides: Callable[[Policy], Policy],
        digest: str,
        *,
        policy: Policy,
        interval_s: float = CHECK_INTERVAL_S,
        clock: Clock = SYSTEM_CLOCK,
        count: Callable[[ReloadResult], None] = lambda result: None,
        report_restarts: Callable[[tuple[str, ...]], None] = lambda fields: None,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.path = str(path)
        self.overrides = overrides
        self.interval_s = interval_s
        self.count = count
        self.report_restarts = report_restarts
        # What is in force (read by /status on another thread: one reference, replaced whole), and the parts
        # holding it, in the order they registered; both are the scan loop's to change.
        self.in_force = InForce(policy, digest)
        self._holders: list[tuple[str, ApplyPolicy]] = []
        self.log = log if log is not None else structlog.get_logger(__name__)
        # (why the file's content is refused now, None while it is good; looks at the file completed), published
        # together once a look ends: a reader (/status, a test counting the reloader's cycles) never sees a look's
        # result beside the count from before it
        self.looked: tuple[str | None, int] = (None, 0)
        self._invalid: str | None = None  # the look under way's result, published with its count
        self.clock = clock
        self._seen = digest  # the content last put in force or refused
        self._seen_error: str | None = None  # why that content was refused
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of what the path led to at the last look
        self._changed: tuple[str, float] | None = None  # a content changed in place, and when it was first read
        self._failures = 0  # reads failed in a row
        self._unreadable = FailureRun()
        self._retry = Backoff(0.1, interval_s)
        self._lock = threading.Lock()
        self._pending: Loaded | None = None
        self.loop = BackgroundLoop("vramguard-policy", self.check, clock=clock, log=self.log)

    @property
    def invalid(self) -> str | None:
        """Why the file's content is refused now; None while it is good."""
        return self.looked[0]

    @property
    def checks(self) -> int:
        """Looks at the file completed."""
        return self.looked[1]

    def start(self) -> None:
        self.loop.start()

    def stop(self, deadline: float) -> None:
        self.loop.stop(deadline)

    def take(self) -> Loaded | None:
        """The good policy read since the last take, if any (the scan loop's cheap look, once a scan)."""
        with self._lock:
            loaded, self._pending = self._pending, None
        return loaded

    def register(self, name: str, apply: ApplyPolicy) -> None:
        """`apply` puts a reloaded policy in force in the part `name` (after the parts registered before it)."""
        if any(name == known for known, _ in self._holders):
            raise ValueError(f"a policy holder named {name!r} is registered already")
        self._holders.append((name, apply))

    def holders(self) -> tuple[str, ...]:
        """The parts that hold policy, in the order a reload reaches them."""
        return tuple(name for name, _ in self._holders)

    def apply_pending(self, built: Built) -> InForce | None:
        """Put the good policy read since the last look in force, if any: fitted to the parts the agent `built` at
        start (`fit`), handed to every holder in order, and counted once. On the scan loop's thread, at the start
        of a scan: nothing the scan reads changes under it."""
        loaded = self.take()
        if loaded is None:
            return None
        policy, restart = fit(loaded.policy, built, self.in_force.policy)
        in_force = InForce(policy, loaded.digest, restart)
        for _, apply in self._holders:
            apply(in_force)
        self.in_force = in_force
        self.count(ReloadResult.APPLIED)
        self.report_restarts(restart)
        self.log.info(
            "policy_reloaded",
            digest=loaded.digest[:12],
            mode=policy.mode.value,
            restart_needed=list(restart) or None,
        )
        return in_force

    def check(self) -> float:
        """One look at the file; the seconds until the next."""
        try:
            return self._look()
        finally:
            self.looked = (self._invalid, self.looked[1] + 1)

    def _look(self) -> float:
        try:
            read = read_policy_file(self.path)
        except FileRefused as e:
            self._file = e.file
            return self._refused(str(e))
        except OSError as e:
            return self._failed(f"cannot read the file: {e.strerror or e}")
        self._failures = 0
        self._retry.reset()
        if self._unreadable.ok():
            self.log.info("policy_readable", path=self.path)
        digest = digest_of(read.text.content)
        # Another file (a rename over the path, a ConfigMap's `..data` swap) was whole before it appeared; the first
        # look knows no file before it, and takes a change for one in place.
        swapped = self._file is not None and read.file != self._file
        self._file = read.file
        if digest == self._seen:
            self._changed = None
            self._invalid = self._seen_error  # unchanged (an unreadable spell ends where it began)
            return self.interval_s
        if not swapped and not self._settled(digest):
            return self.interval_s
        self._changed = None
        self._seen = digest
        try:
            policy = self.overrides(policy_from_text(read.text, self.path))
        except PolicyError as e:
            self._refuse(digest, [str(error) for error in e.errors])
            return self.interval_s
        self._seen_error = self._invalid = None
        with self._lock:
            self._pending = Loaded(policy, digest)
        return self.interval_s

    def _settled(self, digest: str) -> bool:
        """Whether a content changed in place has stayed `digest` for an interval: a writer that writes in steps may
        be halfway, and one that pauses for less than an interval is not caught there."""
        now = self.clock.now()
        if self._changed is None or self._changed[0] != digest:
            self._changed = (digest, now)
            return False
        return now - self._changed[1] >= self.interval_s

    def _refuse(self, digest: str, errors: list[str]) -> None:
        self._seen_error = self._invalid = f"invalid policy in {self.path}: " + "; ".join(errors)
        self.count(ReloadResult.INVALID)
        self.log.error("policy_invalid", path=self.path, digest=digest[:12], errors=errors, keeping="last good policy")

    def _refused(self, why: str) -> float:
        """Not a regular file, or too big: never a swap caught mid-way (that is a missing file), so refused at once
        and looked at again at the interval, for a good file swapped in."""
        self._failures = 0
        self._retry.reset()
        self._invalid = f"{self.path}: {why}"
        if self._unreadable.failed(why):
            self.count(ReloadResult.INVALID)
            self.log.error("policy_refused", path=self.path, error=why, keeping="last good policy")
        return self.interval_s

    def _failed(self, why: str) -> float:
        self._failures += 1
        if self._failures >= UNREADABLE_AFTER and self._unreadable.failed(why):
            self._invalid = f"{self.path}: {why}"
            self.count(ReloadResult.INVALID)
            self.log.error("policy_unreadable", path=self.path, error=why, keeping="last good policy")
        return self._retry.next()
