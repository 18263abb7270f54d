"""The stand-ins for the API server where there is none (`--pods-file`): Events go to the log, and every eviction,
an API call, fails visibly."""

from __future__ import annotations

import structlog

from vramguard.core.pod import EventSubject, PodInfo
from vramguard.core.ports import EvictResult


class LogEventRecorder:
    """Events when there is no API server to write them to (`--pods-file`): they go to the log instead."""

    def __init__(self) -> None:
        self.log = structlog.get_logger(__name__)

    def record(
        self, pod: EventSubject, reason: str, message: str, warning: bool = True, important: bool = False
    ) -> None:
        self.log.warning("event", pod=pod.key, reason=reason, message=message)


class NoApiEvictor:
    """Eviction is an API call; with `--pods-file` there is no API server, so every eviction fails, visibly."""

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        return EvictResult(evicted=False, refused=False, message="no API server: eviction needs the Kubernetes API")
