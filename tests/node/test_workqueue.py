"""The work queue driven from several real threads: a waiting `get` wakes for a held-back key when its time comes
(nobody polls it), never hands one key to two workers at once, and lets every waiting worker go at `shut_down`.
The queue's logic, on a FakeClock and one thread, is in tests/unit/base/test_workqueue.py."""

from __future__ import annotations

import random
import threading
import time

from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK
from vramguard.base.workqueue import WorkQueue
from vramguard_testbed.waiting import wait_until


def make(retry_s: float = 0.01) -> WorkQueue[str]:
    return WorkQueue(lambda: Backoff(retry_s, 4 * retry_s), SYSTEM_CLOCK)


class Taker:
    """A worker thread: takes keys with a blocking `get` until it returns None, noting when each came."""

    def __init__(self, queue: WorkQueue[str]) -> None:
        self.queue = queue
        self.taken: list[tuple[str, float]] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while (key := self.queue.get(block=True)) is not None:
            self.taken.append((key, SYSTEM_CLOCK.now()))
            self.queue.done(key)


def test_a_waiting_get_wakes_when_a_held_back_key_comes_due() -> None:
    """A worker blocked in `get` takes each held-back key once its time has come, earliest first, with nothing
    else calling the queue: the queue wakes itself, as client-go's delaying queue does."""
    queue = make()
    taker = Taker(queue)
    start = SYSTEM_CLOCK.now()
    queue.add_after("late", 0.3)
    queue.add_after("soon", 0.1)
    wait_until(lambda: len(taker.taken) == 2, what="both held-back keys taken")
    (soon, soon_at), (late, late_at) = taker.taken
    assert (soon, late) == ("soon", "late")
    assert soon_at - start >= 0.1 and late_at - start >= 0.3, "never before its time"
    queue.shut_down()
    taker.thread.join(5.0)
    assert not taker.thread.is_alive()


def test_a_sooner_key_cuts_a_long_wait_short() -> None:
    """A worker waiting for a key due in a minute wakes for one held back for a moment, added meanwhile."""
    queue = make()
    queue.add_after("resync", 60.0)
    taker = Taker(queue)
    wait_until(lambda: queue.until_due() is not None, what="the worker waiting")
    start = SYSTEM_CLOCK.now()
    queue.add_after("retry", 0.05)
    wait_until(lambda: taker.taken, what="the sooner key taken")
    assert taker.taken[0][0] == "retry" and taker.taken[0][1] - start < 30.0
    queue.shut_down()
    taker.thread.join(5.0)
    assert not taker.thread.is_alive()


def test_shut_down_lets_every_waiting_worker_go() -> None:
    """Workers blocked in `get` with nothing to take all return None at `shut_down`."""
    queue = make()
    takers = [Taker(queue) for _ in range(3)]
    queue.shut_down()
    for taker in takers:
        taker.thread.join(5.0)
        assert not taker.thread.is_alive() and taker.taken == []


def test_many_adders_and_workers_never_share_a_key_and_leave_nothing_behind() -> None:
    """Four threads add twenty keys every way (ready, first, held back, on back-off) while three workers take them:
    no key is ever handed to two workers at once, every key added is taken, and once the last held-back key came
    due the queue holds nothing."""
    queue = make()
    lock = threading.Lock()
    in_hand: set[str] = set()
    clashes: list[str] = []
    taken: set[str] = set()

    def work() -> None:
        while (key := queue.get(block=True)) is not None:
            with lock:
                if key in in_hand:
                    clashes.append(key)
                in_hand.add(key)
                taken.add(key)
            time.sleep(0.0005)  # hold it a moment, so that an add of the same key meets it handed out
            with lock:
                in_hand.discard(key)
            queue.done(key)

    def add(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            key = f"k{rng.randrange(20)}"
            way = rng.randrange(4)
            if way == 0:
                queue.add(key)
            elif way == 1:
                queue.add(key, first=True)
            elif way == 2:
                queue.add_after(key, rng.uniform(0.0, 0.05))
            else:
                queue.add_rate_limited(key)

    workers = [threading.Thread(target=work, daemon=True) for _ in range(3)]
    adders = [threading.Thread(target=add, args=(seed,), daemon=True) for seed in range(4)]
    for thread in [*workers, *adders]:
        thread.start()
    for thread in adders:
        thread.join(10.0)
    wait_until(lambda: not queue.snapshot(), timeout_s=10.0, what="every key taken and done")
    queue.shut_down()
    for thread in workers:
        thread.join(5.0)
        assert not thread.is_alive()
    assert clashes == [], "a key handed to two workers at once"
    assert taken == {f"k{i}" for i in range(20)}
