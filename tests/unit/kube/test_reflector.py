"""The reflector's requests, without a server: what it asks for, in which order, and how long it waits between.

The API server's side of each (served from the watch cache, bookmarks) is tested against a real one in
tests/cluster/test_fleet.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest
import structlog
from kubernetes.client.exceptions import ApiException
from structlog.testing import capture_logs
from urllib3.exceptions import ReadTimeoutError

from vramguard.kube.reflector import SPREAD_S, WORKING_S, Reflector
from vramguard_testbed.fakes import FakeClock

LOG = structlog.get_logger("test")


@dataclass
class Listed:
    """A LIST's answer."""

    resource_version: str
    names: Sequence[str] = ()


class Ev(NamedTuple):
    """One watch event as the server sends it."""

    type: str
    name: str
    resource_version: str


@dataclass
class Watched:
    """A WATCH's answer: these events, then the server ends it — or `then` is raised while reading."""

    events: Sequence[Ev] = ()
    then: Exception | None = None
    lasts_s: float = 60.0  # the clock moves this much while it runs


class Hang:
    """A WATCH's answer on which the reflector is stopped while it reads: what a stop does to a blocked read."""


class HangingResponse:
    """Stops the reflector from inside its read, and notes whether the stop shut the response down (which is what
    ends a read blocked on a silent server)."""

    def __init__(self, reflector: Reflector, clock: FakeClock) -> None:
        self.reflector = reflector
        self.clock = clock
        self.shut_down = False
        self.shut_down_by_stop = False

    def stream(self, amt: int, decode_content: bool) -> Iterator[bytes]:
        self.reflector.stop(self.clock.now())
        self.shut_down_by_stop = self.shut_down
        yield from ()

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        self.shut_down = True


class WatchResponse:
    def __init__(self, answer: Watched, clock: FakeClock) -> None:
        self.answer = answer
        self.clock = clock

    def stream(self, amt: int, decode_content: bool) -> Iterator[bytes]:
        for kind, name, rv in self.answer.events:
            if kind == "ERROR":
                obj: dict[str, Any] = {"code": int(name), "message": "gone"}
            else:
                obj = {"metadata": {"name": name, "resourceVersion": rv}}
            yield json.dumps({"type": kind, "object": obj}).encode() + b"\n"
        self.clock.step(self.answer.lasts_s)
        if self.answer.then is not None:
            raise self.answer.then

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


@dataclass
class FakeServer:
    """The list method of one kind, answering from a script; stops the reflector when the script runs out."""

    script: list[Listed | Watched | Hang | Exception]
    clock: FakeClock = field(default_factory=FakeClock)
    requests: list[str] = field(default_factory=list)
    reflector: Reflector | None = None
    hung: list[HangingResponse] = field(default_factory=list)

    def __call__(self, **kwargs: Any) -> Any:
        verb = "WATCH" if kwargs.get("watch") else "LIST"
        rv = kwargs.get("resource_version")
        match = kwargs.get("resource_version_match")
        self.requests.append(f"{verb} rv={rv}" + (f" {match}" if match else ""))
        if not self.script:
            assert self.reflector is not None
            self.reflector.stop(self.clock.now())
            raise ConnectionError("script done")
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, Listed):
            items = [{"metadata": {"name": n}} for n in answer.names]
            return type("R", (), {"data": json.dumps({"metadata": {"resourceVersion": answer.resource_version},
                                                      "items": items})})()  # fmt: skip
        if isinstance(answer, Hang):
            assert self.reflector is not None
            self.hung.append(HangingResponse(self.reflector, self.clock))
            return self.hung[-1]
        return WatchResponse(answer, self.clock)


class Names:
    """A store of object names."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        self.names = {str(i["metadata"]["name"]) for i in items}

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = str(obj["metadata"]["name"])
        if kind == "DELETED":
            self.names.discard(name)
        else:
            self.names.add(name)


def run(script: list[Listed | Watched | Hang | Exception], draw: float = 0.5) -> tuple[list[str], list[float], Names]:
    """Run a reflector over `script` to its end: the requests it made, the delays it waited, its store."""
    server = FakeServer(script)
    store = Names()
    reflector = Reflector("things", server, store, log=LOG, clock=server.clock, rng=lambda: draw)
    server.reflector = reflector
    reflector.loop.run()
    return server.requests, server.clock.waits, store


REFUSED = ConnectionRefusedError("refused")
GONE = ApiException(status=410, reason="Gone")
SILENT = ReadTimeoutError(None, None, "Read timed out.")  # type: ignore[arg-type]  # urllib3's, from a pool


@dataclass(frozen=True)
class Case:
    id: str
    script: list[Listed | Watched | Hang | Exception]
    requests: list[str]
    delays: list[float]
    names: set[str]


CASES = [
    Case(
        "first-list-from-the-cache-then-watch-renewed-from-the-last-bookmark",
        [Listed("5", ["a"]), Watched([Ev("ADDED", "b", "6"), Ev("BOOKMARK", "", "9")]), Watched()],
        ["LIST rv=0", "WATCH rv=5", "WATCH rv=9", "WATCH rv=9"],
        [],
        {"a", "b"},
    ),
    Case(
        "a-broken-watch-resumes-from-where-it-was-after-a-random-spread-no-relist",
        [Listed("5"), Watched([Ev("ADDED", "b", "7")], then=REFUSED), Watched([Ev("DELETED", "b", "8")])],
        ["LIST rv=0", "WATCH rv=5", "WATCH rv=7", "WATCH rv=8"],
        [0.5 * SPREAD_S],
        set(),
    ),
    Case(
        "410-on-the-watch-relists-not-older-than-what-it-had",
        [Listed("5", ["a"]), Watched([Ev("ADDED", "b", "7"), Ev("ERROR", "410", "")]), Listed("20", ["c"])],
        ["LIST rv=0", "WATCH rv=5", "LIST rv=7 NotOlderThan", "WATCH rv=20"],
        [],
        {"c"},
    ),
    Case(
        "410-on-a-list-lists-the-latest",
        [Listed("5"), Watched([Ev("ERROR", "410", "")]), GONE, Listed("30")],
        ["LIST rv=0", "WATCH rv=5", "LIST rv=5 NotOlderThan", "LIST rv=", "WATCH rv=30"],
        [1.5],
        set(),
    ),
    Case(
        "failures-before-any-list-back-off-exponentially-with-jitter",
        [REFUSED, REFUSED, REFUSED, Listed("1")],
        ["LIST rv=0"] * 4 + ["WATCH rv=1"],
        [1.5, 3.0, 6.0],
        set(),
    ),
    Case(
        "a-watch-failing-at-once-again-and-again-backs-off-it-does-not-spread",
        [Listed("5"), Watched(then=REFUSED), Watched(then=REFUSED, lasts_s=0), REFUSED, Watched()],
        ["LIST rv=0", "WATCH rv=5", "WATCH rv=5", "WATCH rv=5", "WATCH rv=5", "WATCH rv=5"],
        [0.5 * SPREAD_S, 1.5, 3.0],
        set(),
    ),
    Case(
        "watches-the-server-ends-at-once-with-nothing-on-them-back-off-never-spin",
        [Listed("5"), Watched(lasts_s=0), Watched(lasts_s=0), Watched()],
        ["LIST rv=0", "WATCH rv=5", "WATCH rv=5", "WATCH rv=5", "WATCH rv=5"],
        [1.5, 3.0],
        set(),
    ),
    Case(
        "a-silent-watch-is-renewed-at-once",
        [
            Listed("5"),
            Watched([Ev("BOOKMARK", "", "6")], then=SILENT),
            Watched(),
        ],
        ["LIST rv=0", "WATCH rv=5", "WATCH rv=6", "WATCH rv=6"],
        [],
        set(),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reflector_requests(case: Case) -> None:
    """The reflector lists, watches, resumes, relists and backs off as each scripted server answer calls for."""
    requests, delays, store = run(list(case.script))
    assert requests == case.requests
    assert delays == case.delays
    assert store.names == case.names


def test_working_watch_means_open_long_enough() -> None:
    """The spread after a break is for a watch that had been working; the threshold is what the cases assume."""
    assert Watched().lasts_s >= WORKING_S


@pytest.mark.parametrize(
    ("error", "problem"),
    [
        pytest.param(REFUSED, "API server unreachable for 0s (things watch: ConnectionRefusedError: refused)",
                     id="no-answer-is-unreachable"),
        pytest.param(ApiException(status=403, reason="Forbidden"), "things watch failed: 403 Forbidden",
                     id="an-answer-is-a-failure"),
    ],
)  # fmt: skip
def test_problem_tells_no_answer_from_an_error(error: Exception, problem: str) -> None:
    """problem() calls a server that does not answer unreachable, and an error answer a failed watch."""
    server = FakeServer([Listed("5"), Watched(then=error)])
    reflector = Reflector("things", server, Names(), log=LOG, clock=server.clock)
    server.reflector = reflector
    seen: list[str | None] = []
    server.clock.on_wait = lambda: seen.append(reflector.problem())
    reflector.loop.run()
    assert seen[0] == problem


def test_constructed_idle_and_a_stop_shuts_the_watch_down() -> None:
    """The constructor asks nothing; the loop lists then watches; a stop during the watch shuts its response down
    (what ends a read blocked on a silent server) and no request follows."""
    server = FakeServer([Listed("5", ["a"]), Hang()])
    store = Names()
    reflector = Reflector("things", server, store, log=LOG, clock=server.clock)
    server.reflector = reflector
    assert server.requests == [] and not reflector.wait_listed(server.clock.now())
    reflector.loop.run()
    assert reflector.wait_listed(server.clock.now()) and store.names == {"a"}
    assert server.requests == ["LIST rv=0", "WATCH rv=5"]
    assert [r.shut_down_by_stop for r in server.hung] == [True]


def test_a_run_of_failures_is_logged_once() -> None:
    """Three failures in a row, then a success: one `watch_failed` and one `watch_restored`, naming the last error."""
    refused_again = ConnectionRefusedError("refused again")
    script: list[Listed | Watched | Hang | Exception] = [REFUSED, REFUSED, refused_again, Listed("1"), Watched()]
    with capture_logs() as logs:
        run(script)
    seen = [(e["event"], e.get("error") or e.get("after")) for e in logs if e["event"].startswith("watch_")]
    assert seen == [
        ("watch_failed", "ConnectionRefusedError: refused"),
        ("watch_restored", "ConnectionRefusedError: refused again"),
    ]
