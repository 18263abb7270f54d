"""Programs the driver's per-cgroup memory limits (`limits.LimitTarget`s) on a worker thread.

The scan hands over the limits it wants (`update`, never blocking) and takes back what came of them
(`collect`, for Events, metrics and the log); everything that touches the file system or NVML runs on the
worker: finding each container's cgroup v2 directory (a walk of the kubelet's tree under `--cgroup-root`, by pod
UID and container ID), comparing with what the driver holds (Get), setting what differs (Set: soft 0, hard = the
quota's hard limit), clearing limits no longer wanted, and reading back each limited cgroup's usage as the
driver counts it (every context, which per-process rows can miss).

Idempotent: a limit the driver already holds is left alone (an agent restart sets nothing), a changed quota is
set again, a container whose cgroup is not there yet is retried every `retry_s`, and everything is compared
again every `resync_s`. Where the node cannot hold limits at all (no cgroup v2 hierarchy, a driver before R615)
the limiter says so once (`unavailable`) and stops; a GPU that answers NOT_SUPPORTED is left out. The reactive
loop enforces every quota either way.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable, Mapping

import structlog

from vramguard.cgroup import parse_cgroup_path
from vramguard.limits import LimitKey, LimitOutcome, LimitTarget
from vramguard.model import ContainerUsage, GpuDevice
from vramguard.ports import LIMIT_MAX, LimitFailed, LimitsUnavailable, MemoryLimiter
from vramguard.worker import Runner, Worker

# How deep below the v2 root a container's directory may sit: kind nests kubelet.slice/kubelet-kubepods.slice/
# kubelet-kubepods-burstable.slice/<pod>/<container>, and a container may have sub-cgroups of its own.
_MAX_DEPTH = 7


def v2_root(cgroup_root: str) -> str | None:
    """The cgroup v2 hierarchy under `cgroup_root`: itself on a pure v2 host, ``unified`` on a hybrid one."""
    for candidate in (cgroup_root, os.path.join(cgroup_root, "unified")):
        if os.path.exists(os.path.join(candidate, "cgroup.controllers")):
            return candidate
    return None


def locate_cgroups(root: str, pod_uids: Iterable[str]) -> dict[tuple[str, str | None], str]:
    """(pod UID, container ID or None for the pod's own cgroup) → directory, for the pods in `pod_uids`, from a
    walk of the kubelet's directories under the v2 `root` (other directories are not entered)."""
    wanted = set(pod_uids)
    found: dict[tuple[str, str | None], str] = {}
    if not wanted:
        return found

    def walk(directory: str, relative: str, depth: int) -> None:
        try:
            entries = [e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return  # removed while walking, or unreadable: the next walk sees it again
        for entry in entries:
            path = f"{relative}/{entry.name}"
            identity = parse_cgroup_path(path)
            if identity is not None:
                if identity.pod_uid not in wanted:
                    continue
                key = (identity.pod_uid, identity.container_id)
                # The first (shallowest) directory of a container is its own; deeper ones are its sub-cgroups.
                found.setdefault(key, entry.path)
                if identity.container_id is not None:
                    continue
            elif not entry.name.startswith(("kubepods", "kubelet", "besteffort", "burstable")):
                continue
            if depth < _MAX_DEPTH:
                walk(entry.path, path, depth + 1)

    walk(root, "", 1)
    return found


def read_held_limits(
    memory: MemoryLimiter, cgroup_root: str, containers: Iterable[ContainerUsage], devices: Iterable[GpuDevice]
) -> dict[LimitKey, int]:
    """The hard limits the driver holds now for these containers (and their pods' own cgroups), by key: what
    `vramguard top` shows. Empty where the node cannot hold limits. Blocks on NVML: not for the scan loop."""
    root = v2_root(cgroup_root)
    rows = [u for u in containers if u.container_id]
    if root is None or not rows:
        return {}
    index = {d.uuid: d.index for d in devices if d.mig_index is None}
    located = locate_cgroups(root, {u.pod.uid for u in rows})
    held: dict[LimitKey, int] = {}
    for u in rows:
        gpu = index.get(u.device_uuid)
        if gpu is None:
            continue
        for name, container_id in ((u.container, u.container_id), (None, None)):
            path = located.get((u.pod.uid, container_id))
            if path is None or (u.pod.uid, name, u.device_uuid) in held:
                continue
            try:
                found = memory.get(gpu, path)
            except LimitsUnavailable as e:
                if e.whole_driver:
                    return held
                break
            except LimitFailed:
                continue
            if found is not None and found.hard_bytes != LIMIT_MAX:
                held[(u.pod.uid, name, u.device_uuid)] = found.hard_bytes
    return held


class DriverLimiter:
    def __init__(
        self,
        memory: MemoryLimiter,
        cgroup_root: str = "/sys/fs/cgroup",
        *,
        runner: Runner | None = None,
        resync_s: float = 30.0,
        retry_s: float = 2.0,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.memory = memory
        self.cgroup_root = cgroup_root
        self.runner = runner if runner is not None else Worker("driver-limits", max_queue=1)
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.log = log if log is not None else structlog.get_logger("vramguard.limits")
        self._lock = threading.Lock()
        self._outcomes: list[LimitOutcome] = []
        self._held: dict[LimitKey, LimitTarget] = {}
        self._usage: dict[LimitKey, int] = {}
        # Each task handed to the worker gets a ticket; usage counts as fresh only when read by the latest one.
        self._ticket = 0
        self._usage_ticket = -1
        self._unavailable: str | None = None
        self._unsupported_gpus: dict[int, str] = {}
        # Worker-only: what this agent knows the driver holds, by (cgroup directory, GPU index).
        self._programmed: dict[tuple[str, int], LimitTarget] = {}
        self._incomplete = False
        self._probed = False
        # Loop-only: the targets last handed to the worker, and when.
        self._submitted: tuple[LimitTarget, ...] | None = None
        self._submitted_at = -math.inf

    # -- the loop's side ---------------------------------------------------------------------------------------

    def update(self, targets: tuple[LimitTarget, ...], gpus: Iterable[int], now: float) -> None:
        """Hand the limits wanted now to the worker: when they changed, for a retry, or for the periodic resync
        (and in every other scan just a refresh of the limited cgroups' usage). The first call also asks the
        driver whether it can hold limits on `gpus` at all, so `unavailable` is known before any pod has a
        quota. Never blocks."""
        if self._unavailable is not None:
            return
        if not self._probed:
            gpu_list = tuple(gpus)
            self._probed = self.runner.submit(lambda: self._probe(gpu_list))
        due = self.retry_s if self._incomplete else self.resync_s
        ticket = self._ticket + 1
        if targets == self._submitted and now - self._submitted_at < due:
            if self.runner.submit(lambda: self._refresh_usage(ticket)):
                self._ticket = ticket  # else the worker is still busy: the next scan asks again
            return
        if self.runner.submit(lambda: self._reconcile(targets, ticket)):
            self._submitted, self._submitted_at, self._ticket = targets, now, ticket

    def collect(self) -> list[LimitOutcome]:
        """The outcomes since the last call (for Events, metrics, the log)."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
        return outcomes

    def held(self) -> Mapping[LimitKey, LimitTarget]:
        """The limits the driver holds, as of the last reconcile."""
        with self._lock:
            return dict(self._held)

    def fresh_usage(self) -> Mapping[LimitKey, int]:
        """Each limited cgroup's memory per GPU as the driver counts it, read since the previous `update` (by
        the task it handed over); empty when that task has not finished, so a scan never takes an old figure."""
        with self._lock:
            return dict(self._usage) if self._usage_ticket == self._ticket else {}

    @property
    def unavailable(self) -> str | None:
        """Why this node cannot hold driver limits at all, or None (as far as the limiter has found out)."""
        return self._unavailable

    def unsupported_gpus(self) -> Mapping[int, str]:
        with self._lock:
            return dict(self._unsupported_gpus)

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the worker. The limits stay: they protect the neighbours while the agent is away."""
        self.runner.stop(timeout_s)

    # -- the worker's side -------------------------------------------------------------------------------------

    def _probe(self, gpus: tuple[int, ...]) -> None:
        root = v2_root(self.cgroup_root)
        if root is None:
            self._give_up(f"no cgroup v2 hierarchy under {self.cgroup_root} (the driver's limits need cgroup v2)")
            return
        for gpu in gpus:
            try:
                self.memory.get(gpu, root)  # no limit on the root: NOT_FOUND, i.e. None, where supported
            except LimitsUnavailable as e:
                if e.whole_driver:
                    self._give_up(str(e))
                    return
                self.log.warning("driver_limits_unsupported", gpu=gpu, reason=str(e), fallback="reactive enforcement")
                with self._lock:
                    self._unsupported_gpus[gpu] = str(e)
            except LimitFailed:
                pass  # this cgroup only; the containers' own are what matter

    def _reconcile(self, targets: tuple[LimitTarget, ...], ticket: int) -> None:
        root = v2_root(self.cgroup_root)
        if root is None:
            self._give_up(f"no cgroup v2 hierarchy under {self.cgroup_root} (the driver's limits need cgroup v2)")
            return
        located = locate_cgroups(root, {t.pod.uid for t in targets})
        wanted: dict[tuple[str, int], LimitTarget] = {}
        incomplete = False
        for t in targets:
            if t.gpu_index in self._unsupported_gpus:
                continue
            path = located.get((t.pod.uid, t.container_id))
            if path is None:
                incomplete = True  # the container's cgroup is not there yet (or is gone): try again soon
                continue
            wanted[(path, t.gpu_index)] = t
        outcomes: list[LimitOutcome] = []
        usage: dict[LimitKey, int] = {}
        for (path, gpu), t in wanted.items():
            try:
                outcome = self._program(path, gpu, t, usage)
            except LimitsUnavailable as e:
                if e.whole_driver:
                    self._give_up(str(e))
                    return
                with self._lock:
                    self._unsupported_gpus[gpu] = str(e)
                outcomes.append(LimitOutcome(t, "unsupported", str(e)))
                continue
            except LimitFailed as e:
                outcomes.append(LimitOutcome(t, "failed", str(e)))
                incomplete = True
                continue
            if outcome is not None:
                outcomes.append(outcome)
        outcomes += self._clear_unwanted(wanted)
        self._incomplete = incomplete
        with self._lock:
            self._outcomes += outcomes
            self._held = {t.key: t for t in self._programmed.values()}
            self._usage, self._usage_ticket = usage, ticket

    def _program(self, path: str, gpu: int, t: LimitTarget, usage: dict[LimitKey, int]) -> LimitOutcome | None:
        """Make the driver hold `t` on `path`; the outcome to report, or None when nothing new happened."""
        current = self.memory.get(gpu, path)
        known = self._programmed.get((path, gpu))
        if current is not None and current.soft_bytes == 0 and current.hard_bytes == t.hard_bytes:
            usage[t.key] = current.used_bytes
            self._programmed[(path, gpu)] = t
            return None if known is not None else LimitOutcome(t, "unchanged", "the driver already holds it")
        self.memory.set(gpu, path, 0, t.hard_bytes)
        self._programmed[(path, gpu)] = t
        if current is not None:
            usage[t.key] = current.used_bytes
        was = f" (was {current.hard_bytes} bytes)" if current is not None else ""
        return LimitOutcome(t, "applied", f"{t.describe()}{was}")

    def _clear_unwanted(self, wanted: Mapping[tuple[str, int], LimitTarget]) -> list[LimitOutcome]:
        outcomes = []
        for (path, gpu), old in list(self._programmed.items()):
            if (path, gpu) in wanted:
                continue
            del self._programmed[(path, gpu)]
            if not os.path.isdir(path):
                continue  # removed with its cgroup, and its limits with it
            try:
                self.memory.set(gpu, path, 0, LIMIT_MAX)
            except (LimitsUnavailable, LimitFailed) as e:
                outcomes.append(LimitOutcome(old, "failed", f"clearing: {e}"))
                continue
            outcomes.append(LimitOutcome(old, "cleared"))
        return outcomes

    def _refresh_usage(self, ticket: int) -> None:
        usage: dict[LimitKey, int] = {}
        for (path, gpu), t in list(self._programmed.items()):
            try:
                current = self.memory.get(gpu, path)
            except (LimitsUnavailable, LimitFailed):
                continue  # the next reconcile reports it
            if current is not None:
                usage[t.key] = current.used_bytes
        with self._lock:
            self._usage, self._usage_ticket = usage, ticket

    def _give_up(self, reason: str) -> None:
        if self._unavailable is None:
            self.log.warning("driver_limits_unavailable", reason=reason, fallback="reactive enforcement")
        self._unavailable = reason
        with self._lock:
            self._held = {}
            self._usage = {}
