"""The stand-ins for an absent API server (`--pods-file`): Events in the log, evictions failing visibly."""

from __future__ import annotations

from structlog.testing import capture_logs

from vramguard.core.pod import NodeRef
from vramguard.kube.no_api import LogEventRecorder, NoApiEvictor
from vramguard_testbed.fakes import pod


def test_without_an_api_server_events_go_to_the_log() -> None:
    """`--pods-file`: an Event is a log line with its pod (or Node), reason and message."""
    with capture_logs() as logs:
        LogEventRecorder().record(pod("trainer", "ml"), "VRAMQuotaExceeded", "over by 2Gi")
        LogEventRecorder().record(NodeRef("node-1"), "VRAMGPUNeedsReset", "GPU 0", warning=False)
    assert [(e["event"], e["pod"], e["reason"], e["message"]) for e in logs] == [
        ("event", "ml/trainer", "VRAMQuotaExceeded", "over by 2Gi"),
        ("event", "node/node-1", "VRAMGPUNeedsReset", "GPU 0"),
    ]


def test_without_an_api_server_every_eviction_fails_visibly() -> None:
    """Not refused (no budget said no) and not gone: failed, saying why."""
    result = NoApiEvictor().evict(pod("trainer", "ml"), "over quota")
    assert (result.evicted, result.refused, result.gone) == (False, False, False)
    assert "no API server" in result.message
