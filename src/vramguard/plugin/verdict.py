"""What `kubectl vramguard recommend` says of a workload's quota in force against its peak. Pure."""

from __future__ import annotations

import enum
from typing import Final

WASTEFUL_RATIO: Final = 2.0  # a quota at least this many times the recommendation is wasteful


class Verdict(str, enum.Enum):
    KILLED = "would have been killed"  # its peak passed the quota's hard limit
    WASTEFUL = "wasteful"  # the quota is at least WASTEFUL_RATIO times the recommendation
    NO_QUOTA = "no quota"
    OK = "ok"
    UNKNOWN = "unknown"  # no pod template to read the quota in force from (a bare pod since gone)


def verdict(peak_bytes: int, quota: int | None, recommended: int, has_quota: bool | None) -> Verdict:
    """The verdict on a quota whose hard limit is `quota` bytes (None: not a number of bytes, a fair share or a DRA
    share), for a peak and its recommendation. `has_quota` None: the quota in force is unknown."""
    if has_quota is None:
        return Verdict.UNKNOWN
    if not has_quota:
        return Verdict.NO_QUOTA
    if quota is not None and peak_bytes > quota:
        return Verdict.KILLED
    if quota is not None and quota >= WASTEFUL_RATIO * recommended:
        return Verdict.WASTEFUL
    return Verdict.OK
