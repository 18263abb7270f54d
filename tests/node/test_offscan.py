"""Calls made off the scan on a real worker thread: a call that hangs never holds up the caller, is given up at its
timeout with its slot freed, the call queued behind it is never made, and its answer comes back late. The same rules
without a thread are in tests/unit/base/test_offscan.py."""

from __future__ import annotations

import threading
import time

from vramguard.base.offscan import Fate, OffScanCalls
from vramguard.base.worker import Worker
from vramguard_testbed.fakes import FakeClock


class HangingCall:
    """A call stuck in a socket read (a frozen API server) until released; `made` lists the calls made, in order."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.made: list[str] = []

    def __call__(self, name: str, hang: bool = False) -> str:
        self.made.append(name)
        if hang:
            self.entered.set()
            self.release.wait(30)
        return f"{name}: answered"


def test_a_hanging_call_is_given_up_and_the_call_behind_it_never_made() -> None:
    """With the real thread: submit and collect return at once while a call hangs; at the timeout both it and the
    call queued behind it are given up and their slots freed; once the call returns, its answer is late and the
    queued one is dropped unmade, while a call submitted after the give-up is answered."""
    clock = FakeClock()
    worker = Worker("test-offscan", max_queue=4, clock=clock)
    calls: OffScanCalls[str, str] = OffScanCalls(worker, 15.0)
    api = HangingCall()
    calls.start()
    try:
        started = time.perf_counter()
        assert calls.submit("pod-a", "hangs", lambda: api("hangs", hang=True), clock.now()) is not None
        assert api.entered.wait(10)
        assert calls.submit("pod-b", "queued", lambda: api("queued"), clock.now()) is not None
        assert calls.collect(clock.now()) == []
        clock.step(15.0)
        given_up = calls.collect(clock.now())
        assert time.perf_counter() - started < 0.5, "nothing waited for the hanging call"
        assert [(e.call.about, e.fate) for e in given_up] == [("hangs", Fate.GIVEN_UP), ("queued", Fate.GIVEN_UP)]
        assert calls.given_up == 2 and calls.waiting() == 0
        assert calls.unfinished("pod-a") and calls.unfinished("pod-b")
        assert calls.submit("pod-c", "after", lambda: api("after"), clock.now()) is not None, "the slots are free"
        api.release.set()
        done = threading.Event()
        assert worker.submit(done.set) and done.wait(10), "the worker ran everything queued before"
        ended = calls.collect(clock.now())
    finally:
        api.release.set()
        calls.stop(clock.now() + 1.0)
    assert [(e.call.about, e.fate, e.value) for e in ended] == [
        ("hangs", Fate.LATE, "hangs: answered"),
        ("queued", Fate.NOT_MADE, None),
        ("after", Fate.ANSWERED, "after: answered"),
    ]
    assert api.made == ["hangs", "after"], "a call given up on before it began is never made"
    assert not calls.unfinished("pod-a") and not calls.unfinished("pod-b")
