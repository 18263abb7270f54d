"""The rule of `kubectl vramguard recommend`: a peak in, the quota to recommend out. Pure, and the only place that
says how much headroom a workload gets and how the amount is rounded, as krr keeps each strategy apart from the
data it reads and the report it writes.

The recommended quota is the peak plus the headroom, rounded up to a friendly amount (`friendly`) and to the unit
of the field it goes into.
"""

from __future__ import annotations

import math
from typing import Final

from vramguard.core.quantity import MIN_QUOTA_BYTES, MiB

DEFAULT_HEADROOM: Final = 0.20


def friendly(n_bytes: float, unit_bytes: int = 1) -> int:
    """`n_bytes` rounded up to a friendly amount: a multiple of the largest power of two MiB that is at most an
    eighth of it (so at most 12.5 % above it: 10.8Gi → 11Gi, 700Mi → 704Mi), and of `unit_bytes`; at least 1Mi."""
    step = MiB
    while step * 16 <= n_bytes:
        step *= 2
    step = math.lcm(step, unit_bytes)
    return max(MIN_QUOTA_BYTES, math.ceil(n_bytes / step) * step)


def recommended_bytes(peak_bytes: int, headroom: float, unit_bytes: int = 1) -> int:
    """The quota a workload that peaked at `peak_bytes` needs: the peak and `headroom` (0.2: a fifth more),
    rounded up by `friendly` to a multiple of the field's unit."""
    return friendly(peak_bytes * (1.0 + headroom), unit_bytes)
