"""The decision core: quotas, policy, decisions and limit planning. No I/O, no clock, no threads: pure
functions, and trackers (peaks, exited, orphans, the limit plan) that keep state between scans and are handed the
scan's time."""
