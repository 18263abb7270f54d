"""Peaks a scrape cannot miss: the highest GPU memory each container used on each GPU over the last minute.

Prometheus samples the usage gauge at its scrape interval (30 s is common), so a training step that peaks for two
seconds between two scrapes never shows there, though the agent's scans saw it (the watch between scans calls for a
scan within 20 ms of any change past `watch_rise`). `PeakWindow` keeps, for each (pod, container, GPU), the highest
usage of the scans of the last `window_s`: exported as a gauge, its `max_over_time` over any range is the true peak
at the scans' granularity, whatever the scrape interval up to the window. It keeps state between scans, with
no I/O and no clock: the scan's time is handed in.

It also keeps each subject's highest usage since the agent's first scan (`highest`), bounded the same way: what
`kubectl vramguard recommend` reads from /status where no Prometheus keeps the history.

The usage a scan saw is the snapshot's rows, which carry the driver's own count for a container whose cgroup holds
a driver limit (`limit_plan.with_driver_usage`, read since the scan before): that reading between scans counts too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vramguard.core.driver_limit import LimitKey
from vramguard.core.pod import PodInfo
from vramguard.core.sample import GpuDevice
from vramguard.core.snapshot import ContainerUsage

PEAK_WINDOW_S = 60.0  # at least any sane scrape interval: Prometheus' default is 1 m, and 15-30 s is common
# As many series as /status has rows. The rows of one scan are bounded by the GPU processes NVML lists; what the
# window adds is the containers that stopped using a GPU in the last minute, the first of them dropped past this.
MAX_PEAK_SERIES = 4096


@dataclass(frozen=True, slots=True)
class Peak:
    """The highest usage of one container on one GPU in the window (`container` as the usage rows name it)."""

    pod: PodInfo
    container: str
    device_uuid: str
    gpu: str  # the device's label, as the usage metric's `gpu`
    peak_bytes: int


@dataclass(slots=True)
class _Series:
    """One subject's window: (time, bytes) with bytes strictly decreasing, so the first is the window's peak."""

    pod: PodInfo
    container: str
    device_uuid: str
    gpu: str
    points: deque[tuple[float, int]]
    seen_at: float  # the last scan that had a row for it


@dataclass(frozen=True, slots=True)
class Highest:
    """Each subject's highest usage since the first scan (`PeakWindow.highest`), and how long that is."""

    peaks: tuple[Peak, ...] = ()
    covers_s: float = 0.0  # from the first scan to the one asked about


class PeakWindow:
    """`observe(rows, devices, now)` after each scan; it returns the peaks of the window ending then."""

    def __init__(self, window_s: float = PEAK_WINDOW_S, max_series: int = MAX_PEAK_SERIES) -> None:
        if window_s <= 0 or max_series < 1:
            raise ValueError("need window_s > 0 and max_series >= 1")
        self.window_s = window_s
        self.max_series = max_series
        self._series: dict[LimitKey, _Series] = {}
        # Since the first scan: each subject's highest, and when it last had a row (the first dropped past the bound).
        self._highest: dict[LimitKey, tuple[Peak, float]] = {}
        self._since: float | None = None

    def observe(self, rows: Iterable[ContainerUsage], devices: Mapping[str, GpuDevice], now: float) -> tuple[Peak, ...]:
        """Take one scan's usage rows (at `now`, on the scan's clock) and give every peak of the window ending
        then: each subject with a row in the window, this scan's or an earlier one's."""
        if self._since is None:
            self._since = now
        for u in rows:
            device = devices.get(u.device_uuid)
            gpu = device.label if device is not None else u.device_uuid
            key = LimitKey(u.pod.uid, u.container, u.device_uuid)
            held = self._highest.get(key)
            highest = max(u.used_bytes, held[0].peak_bytes) if held is not None else u.used_bytes
            self._highest[key] = (Peak(u.pod, u.container, u.device_uuid, gpu, highest), now)
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series(u.pod, u.container, u.device_uuid, gpu, deque(), now)
            series.pod, series.gpu, series.seen_at = u.pod, gpu, now  # the newest names
            points = series.points
            while points and points[-1][1] <= u.used_bytes:
                points.pop()  # never the peak again while this one is in the window
            points.append((now, u.used_bytes))
        start = now - self.window_s
        for key in list(self._series):
            points = self._series[key].points
            while points and points[0][0] < start:
                points.popleft()
            if not points:
                del self._series[key]
        if len(self._series) > self.max_series:
            by_age = sorted(self._series, key=lambda k: self._series[k].seen_at)
            for key in by_age[: len(self._series) - self.max_series]:
                del self._series[key]  # the longest gone from the GPU first
        if len(self._highest) > self.max_series:
            by_age = sorted(self._highest, key=lambda k: self._highest[k][1])
            for key in by_age[: len(self._highest) - self.max_series]:
                del self._highest[key]
        return tuple(Peak(s.pod, s.container, s.device_uuid, s.gpu, s.points[0][1]) for s in self._series.values())

    def highest(self, now: float) -> Highest:
        """Each subject's highest usage since the first scan (the `max_series` last seen at most), as of `now`."""
        covers_s = max(0.0, now - self._since) if self._since is not None else 0.0
        return Highest(tuple(peak for peak, _ in self._highest.values()), covers_s)
