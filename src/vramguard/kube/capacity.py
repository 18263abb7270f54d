"""`vramguard.io/vram` in the Node's status: what the scheduler may hand out, advertised by a status PATCH."""

from __future__ import annotations

from typing import Final

import structlog
from kubernetes import client

from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.base.worker import Runner, Worker
from vramguard.core.sample import GpuSample
from vramguard.kube.client import TIMEOUT_WRITE, describe

VRAM_RESOURCE: Final = "vramguard.io/vram"

Log = structlog.typing.FilteringBoundLogger


def advertisable_bytes(sample: GpuSample, reserve_bytes: int) -> int:
    """GPU memory the scheduler may hand out: every schedulable memory domain (a whole GPU, or the MIG
    instances of a partitioned one — not the parent as well) that answers NVML, minus the reserve, never below
    zero."""
    partitioned = {d.parent_uuid for d in sample.devices if d.parent_uuid is not None}
    total = sum(d.total_bytes for d in sample.devices if d.healthy and d.uuid not in partitioned)
    return max(0, total - reserve_bytes)


_UNKNOWN = "unknown"


class KubeCapacityPublisher:
    """Advertises `vramguard.io/vram` in the Node's status capacity and allocatable, or withdraws it.

    `publish` and `withdraw` only hand the PATCH to a background worker; a PATCH is made only when the amount
    differs from the last one published, and after a failure not before the back-off (10 s doubling to 10 min,
    jittered) has passed: a policy that denies it must not cost the API server one PATCH per scan.
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        reserve_bytes: int = 0,
        log: Log | None = None,
        clock: Clock = SYSTEM_CLOCK,
        runner: Runner | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        """Nothing is patched before `start()`: until then, the latest `publish` or `withdraw` waits."""
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.reserve_bytes = reserve_bytes
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.clock = clock
        self.runner: Runner = runner if runner is not None else Worker("vramguard-capacity", max_queue=1, clock=clock)
        self._published: int | str | None = _UNKNOWN
        self._in_flight = False
        self._retry_at = 0.0
        self._backoff = backoff if backoff is not None else Backoff(10.0, 600.0, jitter=0.2)
        self._failures = FailureRun()  # PATCHes failing: logged once per distinct error, not once per retry

    def publish(self, sample: GpuSample) -> None:
        self._submit(advertisable_bytes(sample, self.reserve_bytes))

    def withdraw(self) -> None:
        self._submit(None)

    def start(self) -> None:
        self.runner.start()

    def stop(self, deadline: float) -> None:
        self.runner.stop(deadline)

    def _submit(self, total_bytes: int | None) -> None:
        if self._in_flight or total_bytes == self._published or self.clock.now() < self._retry_at:
            return
        self._in_flight = True
        if not self.runner.submit(lambda: self._patch(total_bytes)):
            self._in_flight = False

    def _patch(self, total_bytes: int | None) -> None:
        value = str(total_bytes) if total_bytes is not None else None
        # A JSON merge patch sets the key, or with null removes it (and removing an absent key is no error).
        patch = {"status": {"capacity": {VRAM_RESOURCE: value}, "allocatable": {VRAM_RESOURCE: value}}}
        try:
            self.core.patch_node_status(
                self.node_name, patch, _content_type="application/merge-patch+json", _request_timeout=TIMEOUT_WRITE
            )
        except Exception as e:  # best effort: the scheduler's view must never hold up enforcement
            error = describe(e)
            delay = self._backoff.next()
            if self._failures.failed(error):
                self.log.warning("capacity_publish_failed", node=self.node_name, error=error, retry_in_s=round(delay))
            self._retry_at = self.clock.now() + delay
            self._in_flight = False
            return
        self.log.info("capacity_published", node=self.node_name, resource=VRAM_RESOURCE, bytes=total_bytes)
        self._published = total_bytes
        self._backoff.reset()
        self._failures.ok()
        self._in_flight = False  # last: a scan that sees it false also sees what was published
