"""The scan's metrics: a scrape sees one whole scan, never a mix of two."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from vramguard.agent.metrics import Metrics
from vramguard.core.decide import Decision
from vramguard.core.limit_plan import LimitTarget
from vramguard.core.model import GiB
from vramguard.testing.fakes import SnapshotBuilder, gpu, pod


def test_a_scrape_that_started_before_a_scan_published_shows_the_earlier_scan_whole() -> None:
    """A scrape under way when a scan publishes reads the earlier scan to its end; the next scrape reads the new one."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    trainer, notebook = pod("trainer", "ml"), pod("notebook", "ml")
    first = SnapshotBuilder().use(trainer, "main", gpu(0), 2 * GiB).build()
    second = SnapshotBuilder().use(notebook, "main", gpu(1), 3 * GiB).build()
    nothing = Decision(actions=(), violations=())
    limit = LimitTarget(trainer, "main", "cid", 0, gpu(0).uuid, 4 * GiB, "test")
    metrics.observe_scan(first, {}, nothing, driver_limits=[limit], claim_source_up=True)

    scrape = registry.collect()  # a generator: the families are computed as the scrape reads them
    head = next(f for f in scrape if f.name == "vramguard_container_gpu_memory_used_bytes")
    metrics.observe_scan(second, {}, nothing, driver_limits=[], claim_source_up=False)  # publishes mid-scrape
    rest = {f.name: f for f in scrape}

    assert [(s.labels["pod"], s.value) for s in head.samples] == [("trainer", 2 * GiB)]
    assert [s.labels["gpu"] for s in rest["vramguard_gpu_memory_total_bytes"].samples] == ["0"]
    assert [(s.labels["pod"], s.value) for s in rest["vramguard_driver_limit_bytes"].samples] == [("trainer", 4 * GiB)]
    assert [s.value for s in rest["vramguard_claim_source_up"].samples] == [1.0]
    after = {f.name: f for f in registry.collect()}
    assert [s.labels["pod"] for s in after["vramguard_container_gpu_memory_used_bytes"].samples] == ["notebook"]
