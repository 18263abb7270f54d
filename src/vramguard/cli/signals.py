"""How `vramguard run` (and `top`) are told to stop, and how long stopping may take."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# What stopping may take in all, from the stop signal. The DaemonSet sets no terminationGracePeriodSeconds, so the
# kubelet sends SIGKILL after Kubernetes' default of 30 s; the agent aims far lower (docs/scale.md promises SIGTERM
# ends it within 2 s) because the node is unguarded from the stop until its successor scans. A part still busy at
# the deadline (a request to a frozen API server) is abandoned: its thread is a daemon.
SHUTDOWN_BUDGET_S = 1.5
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An Event set by SIGTERM, SIGINT or SIGHUP (whose default would end the agent mid-kill), for the block; the
    handlers before it are put back after."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
