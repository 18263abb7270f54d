"""The HTTP endpoint over real sockets: it answers, defers /status without blocking, frames what goes on the wire,
and is never blinded by clients (floods, trickles, readers that never read, fds run out), and stops promptly.
What a request head is answered is the unit tier's (tests/unit/http/test_server.py)."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from unit.http.test_server import HEALTHZ, REQUEST_LINES, idle_server, parse_response
from vramguard.agent.health import Checks
from vramguard.base.clock import SYSTEM_CLOCK
from vramguard.base.heartbeat import Heartbeat
from vramguard.http.server import HealthServer
from vramguard_testbed.fakes import FakeClock
from vramguard_testbed.measure import cpu_seconds
from vramguard_testbed.waiting import wait_until


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_endpoints_serve_metrics_and_probe_results() -> None:
    """Metrics come from the registry; probes answer 200/503 with their explanation; others are 404."""
    registry = CollectorRegistry()
    Counter("vramguard_test_total", "a test counter", registry=registry).inc(3)
    ready = {"ok": False}
    with _serving(
        registry,
        healthz=Checks("healthz", [[("scan-loop", lambda: (True, "last scan 0.1s ago"))]]),
        readyz=Checks(
            "readyz", [[("pods", lambda: (ready["ok"], "" if ready["ok"] else "pod cache not synced"))]], "ready"
        ),
    ) as server:
        status, body = _get(server.port, "/metrics")
        assert status == 200 and "vramguard_test_total 3.0" in body
        assert _get(server.port, "/healthz") == (200, "last scan 0.1s ago\n")
        assert _get(server.port, "/readyz") == (503, "pod cache not synced\n")
        assert _get(server.port, "/readyz?verbose") == (
            503,
            "[-]pods failed: pod cache not synced\nreadyz check failed\n",
        )
        ready["ok"] = True
        assert _get(server.port, "/readyz") == (200, "ready\n")
        assert _get(server.port, "/nope")[0] == 404


def test_a_status_being_built_waits_while_the_probes_answer() -> None:
    """/status whose body is being built elsewhere waits for it (the build never runs on the server's thread);
    meanwhile /healthz answers; once woken, the waiting client gets the body."""
    built: list[bytes] = []
    with _serving(status=lambda wake: lambda: built[0] if built else None) as server, ExitStack() as stack:
        (waiting,) = _connect_many(stack, server.port, 1, first=b"GET /status HTTP/1.1\r\n\r\n")
        assert _timed_healthz(server.port) < 1.0
        assert select.select([waiting], [], [], 0.2)[0] == [], "no answer before the body is built"
        built.append(b'{"kind": "VramguardStatus"}')
        server.wake()
        response = _read_to_eof(waiting)
    assert response.startswith(b"HTTP/1.1 200 OK") and response.endswith(b'{"kind": "VramguardStatus"}')


def test_a_status_not_built_in_time_is_a_503() -> None:
    """A client does not wait for a build forever: 2 s on the server's clock, then 503 saying so."""
    clock = FakeClock()
    with _serving(status=lambda wake: lambda: None, clock=clock) as server, ExitStack() as stack:
        (waiting,) = _connect_many(stack, server.port, 1, first=b"GET /status HTTP/1.1\r\n\r\n")
        assert _timed_healthz(server.port) < 1.0  # the waiting request has been read by now
        clock.step(1.9)
        assert select.select([waiting], [], [], 0.3)[0] == []
        clock.step(0.2)
        response = _read_to_eof(waiting)
    assert response.startswith(b"HTTP/1.1 503") and response.endswith(b"status not ready in time\n")


# Helpers: a server that is always stopped, raw exchanges, and what /proc says about threads and CPU time.


@contextmanager
def _serving(registry: CollectorRegistry | None = None, **options: Any) -> Iterator[HealthServer]:
    server = idle_server(registry, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop(server.clock.now() + 1.0)


def _read_to_eof(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Sends raw request bytes and reads to EOF: (status, lower-cased headers, body); the answer must be HTTP/1.1."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        return parse_response(_read_to_eof(sock))


def _timed_healthz(port: int) -> float:
    """Seconds a GET /healthz took; fails unless it answered 200."""
    started = time.monotonic()
    assert _exchange(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")[0] == 200
    return time.monotonic() - started


def _closed_by_peer(sock: socket.socket, wait_s: float = 0.0) -> bool:
    """Whether the other end has closed (FIN or RST), waiting up to `wait_s` for it."""
    poller = select.poll()  # select() cannot take fds past 1024, and the flood goes past that
    poller.register(sock, select.POLLIN)
    if not poller.poll(wait_s * 1000):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _count_closed_by_peer(socks: list[socket.socket], at_least: int, timeout_s: float) -> int:
    """How many of `socks` the peer has closed, once that is `at_least` (else fails after `timeout_s`)."""
    wait_until(lambda: sum(_closed_by_peer(s) for s in socks) >= at_least, timeout_s, f"{at_least} closed by the peer")
    return sum(_closed_by_peer(s) for s in socks)


def _tasks() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _connect_many(stack: ExitStack, port: int, count: int, first: bytes = b"G") -> list[socket.socket]:
    """`count` clients that each send `first` (the first byte of a request) and no more: trickling clients, which the
    kernel hands to the server at once. With nothing sent, the kernel holds a connection back for a while
    (TCP_DEFER_ACCEPT)."""
    clients = [stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5)) for _ in range(count)]
    for client in clients:
        if first:
            client.sendall(first)
    return clients


# On the wire: what the read path decides (a head too large), and framing that holds whatever the client sends.


@pytest.fixture(scope="module")
def table_server() -> Iterator[HealthServer]:
    """One server for the whole table (it keeps no state between requests): healthz alive, readyz failing."""
    with _serving(readyz=lambda: (False, "pod cache not synced")) as server:
        yield server


# The unit tier's request lines proven again over a socket; a head too large is the read path's, so only here.
ON_THE_WIRE = {"healthz-is-200", "failing-probe-is-503", "head-no-body", "post-is-405", "garbage-is-400"}


@pytest.mark.parametrize(
    ("request_bytes", "status", "body", "headers"),
    [
        *(case for case in REQUEST_LINES if case.id in ON_THE_WIRE),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n",
            431,
            b"request head too large\n",
            {},
            id="oversized-head-is-431",
        ),
    ],
)
def test_request_line_decides_the_answer(
    table_server: HealthServer, request_bytes: bytes, status: int, body: bytes, headers: dict[str, str]
) -> None:
    """Each request line gets its status and body, always HTTP/1.1 with Connection: close and a true length."""
    got_status, got_headers, got_body = _exchange(table_server.port, request_bytes)
    assert (got_status, got_body) == (status, body)
    assert got_headers.items() >= headers.items()
    assert got_headers["connection"] == "close"
    if not request_bytes.startswith(b"HEAD"):
        assert got_headers["content-length"] == str(len(body))


# Attacks: none may blind the endpoint, grow threads, or burn CPU.


def test_idle_flood_neither_blinds_nor_grows_threads_nor_spins() -> None:
    """1,000 idle connections: /healthz answers at once, one thread, the oldest are closed, CPU stays low."""
    max_connections, flood = 16, 1000
    threads_before = _tasks()
    with _serving(max_connections=max_connections, request_timeout_s=30.0) as server, ExitStack() as stack:
        (server_tid,) = _tasks() - threads_before
        cpu_before, started = cpu_seconds(os.getpid(), int(server_tid)), time.monotonic()

        idle = _connect_many(stack, server.port, flood)
        assert _timed_healthz(server.port) < 1.0
        # A measurement, not a wait for an event: the server's CPU over at least a second of flood.
        time.sleep(max(0.0, started + 1.0 - time.monotonic()))
        cpu_s, wall_s = cpu_seconds(os.getpid(), int(server_tid)) - cpu_before, time.monotonic() - started

        assert len(_tasks()) <= len(threads_before) + 1
        # The probe took a slot too, so every connection but the newest max_connections - 1 is gone.
        oldest, newest = idle[: flood - max_connections + 1], idle[flood - max_connections + 1 :]
        assert _count_closed_by_peer(oldest, at_least=len(oldest), timeout_s=2.0) == len(oldest)
        assert not any(_closed_by_peer(s) for s in newest)
        assert cpu_s < 0.3 * wall_s, f"server thread used {cpu_s:.2f}s of CPU in {wall_s:.2f}s"


def test_connections_that_send_nothing_are_held_by_the_kernel_not_the_server() -> None:
    """1,000 connections that send nothing are not handed to the server until they send (or the kernel's deferral
    ends): /healthz answers at once and the server thread spends nothing on them."""
    threads_before = _tasks()
    with _serving(max_connections=16, request_timeout_s=30.0) as server, ExitStack() as stack:
        (server_tid,) = _tasks() - threads_before
        cpu_before = cpu_seconds(os.getpid(), int(server_tid))
        _connect_many(stack, server.port, 1000, first=b"")
        assert _timed_healthz(server.port) < 1.0
        assert len(server._main.conns) <= 1, "none of them was accepted yet"
        assert cpu_seconds(os.getpid(), int(server_tid)) - cpu_before < 0.2


def test_slowloris_is_cut_at_the_deadline_while_others_are_served() -> None:
    """A client trickling its request is closed once its deadline passes on the server's clock; meanwhile
    /healthz answers promptly."""
    clock = FakeClock()
    with (
        _serving(request_timeout_s=1.0, clock=clock) as server,
        socket.create_connection(("127.0.0.1", server.port)) as slow,
    ):
        served_s: list[float] = []
        for i, byte in enumerate(b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 20):
            slow.send(bytes([byte]))
            served_s.append(_timed_healthz(server.port))
            if i in (10, 20, 30):
                clock.step(0.3)  # 0.9 s in all: still within its deadline
        assert not _closed_by_peer(slow)
        assert max(served_s) < 0.5
        clock.step(0.2)
        assert _closed_by_peer(slow, wait_s=5.0), "closed once past its deadline"


class _PaddingCollector(Collector):
    """About 8 MB of exposition: more than the kernel buffers for a client that does not read."""

    def collect(self) -> Iterable[Metric]:
        gauge = GaugeMetricFamily("vramguard_test_padding", "padding", labels=["pad"])
        for i in range(800):
            gauge.add_metric([f"{i:04d}" + "x" * 10_000], i)
        yield gauge


def test_a_client_that_never_reads_blocks_no_one() -> None:
    """A client that asks for a huge /metrics and never reads stalls only itself, and only until its deadline: with
    the server's clock held before that deadline, /healthz is answered while the stuck client is still held open."""
    registry = CollectorRegistry()
    registry.register(_PaddingCollector())
    full_bytes = len(generate_latest(registry))
    clock = FakeClock()
    with _serving(registry, request_timeout_s=0.8, clock=clock) as server, socket.socket() as stuck:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(("127.0.0.1", server.port))
        stuck.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        answered_s = [_timed_healthz(server.port) for _ in range(3)]  # a blocked server: a timeout at 5 s
        print(f"/healthz beside a client that never reads: the slowest answer in {max(answered_s):.3f} s")
        assert not _closed_by_peer(stuck), "still held: the others were answered beside it, not after it"

        clock.step(0.8)
        stuck.settimeout(5.0)
        received = _read_to_eof(stuck)  # returns once the server gives up on it at its deadline
    assert 0 < len(received) < full_bytes  # it was answered, then cut off mid-response at the deadline


# The server's rounds: what liveness reads of it. A port that takes no one (at its cap, over its CPU budget, or
# flooded) is a busy server, not a stuck one.


def _pending_status(stack: ExitStack, port: int) -> list[socket.socket]:
    """Two clients whose /status is never built: at a cap of 2 they hold every slot and cannot be evicted."""
    return _connect_many(stack, port, 2, first=b"GET /status HTTP/1.1\r\n\r\n")


def _flood_of_healthz(stack: ExitStack, port: int) -> list[socket.socket]:
    """300 whole /healthz requests: a backlog that a server spending 0.1 % of a core takes seconds to serve."""
    return _connect_many(stack, port, 300, first=b"GET /healthz HTTP/1.1\r\n\r\n")


@pytest.mark.parametrize(
    ("fill_port", "options"),
    [
        pytest.param(_pending_status, {"max_connections": 2}, id="port-at-its-cap"),
        pytest.param(_flood_of_healthz, {"max_cpu_fraction": 0.001}, id="port-over-its-cpu-budget"),
    ],
)
def test_a_port_that_takes_no_one_still_goes_round(
    fill_port: Callable[[ExitStack, int], list[socket.socket]], options: dict[str, Any]
) -> None:
    """While the port accepts no one (its slots all hold unanswered clients, or its CPU budget is spent), a client
    waits its turn, but the server's thread keeps going round: its heartbeat, which liveness reads, stays fresh."""
    clock = FakeClock()  # no connection expires, and no /status gives up waiting
    progress = Heartbeat()
    with (
        _serving(status=lambda wake: lambda: None, clock=clock, progress=progress, **options) as server,
        ExitStack() as stack,
    ):
        fill_port(stack, server.port)
        (queued,) = _connect_many(stack, server.port, 1, first=HEALTHZ)
        assert select.select([queued], [], [], 0.3)[0] == [], "the port took no one meanwhile"
        for _ in range(3):
            clock.step(1.0)
            wait_until(lambda: progress.age(clock.now()) == 0.0, 2.0, what="a round of the server after the step")


# Clients (threads, in a process of their own) that ask a port for /healthz as fast as they are answered, for some
# seconds; prints how many answers they got.
_HAMMER = r"""
import socket, sys, threading, time
port, clients, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
answers = []
def client(end):
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
                answer = b"".join(iter(lambda: sock.recv(4096), b""))
            answers.append(answer.startswith(b"HTTP/1.1 200"))
        except OSError:
            time.sleep(0.01)
end = time.monotonic() + seconds
threads = [threading.Thread(target=client, args=(end,)) for _ in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(sum(answers))
"""


def test_a_hammered_port_stays_within_the_cpu_budget_and_goes_round() -> None:
    """20 clients asking for /healthz as fast as they can for 3 s: the server thread stays within its CPU budget
    (15 % of a core), answers some of them, and its rounds never pause for more than half a second."""
    flood_s = 3.0
    threads_before = _tasks()
    progress = Heartbeat()
    with _serving(progress=progress) as server:
        (server_tid,) = _tasks() - threads_before
        cpu_before, started = cpu_seconds(os.getpid(), int(server_tid)), time.monotonic()
        flood = subprocess.Popen(
            [sys.executable, "-c", _HAMMER, str(server.port), "20", str(flood_s)], stdout=subprocess.PIPE, text=True
        )
        oldest_round_s = 0.0
        try:
            while flood.poll() is None:
                oldest_round_s = max(oldest_round_s, progress.age(time.monotonic()) or 0.0)
                time.sleep(0.05)
            answered = int(flood.communicate(timeout=30)[0])
        finally:
            flood.kill()
        cpu_s, wall_s = cpu_seconds(os.getpid(), int(server_tid)) - cpu_before, time.monotonic() - started
    print(
        f"hammer: {answered} answers in {wall_s:.1f}s, server thread {cpu_s / wall_s:.1%} of a core, "
        f"longest between rounds {oldest_round_s:.3f}s"
    )
    assert answered > 0
    assert cpu_s <= 0.15 * wall_s, f"server thread used {cpu_s:.2f}s of CPU in {wall_s:.2f}s"
    assert oldest_round_s < 0.5


_CHILD = """
import resource, sys
import structlog
from prometheus_client import CollectorRegistry
from vramguard.http.server import HealthServer

structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout is the control channel
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
alive = lambda: (True, "alive")
server = HealthServer(0, CollectorRegistry(), alive, alive, host="127.0.0.1")
server.start()
print(server.port, flush=True)
hogged = []
for command in sys.stdin:
    if command == "hog\\n":  # take every fd left, as a leak elsewhere in the agent would
        try:
            while True:
                hogged.append(open("/dev/null"))
        except OSError:
            pass
    elif command == "free\\n":
        for f in hogged:
            f.close()
        hogged.clear()
    print(len(hogged), flush=True)
"""


@contextmanager
def _fd_limited_server(log_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A HealthServer (default limits) in a child whose open-file limit is 64, logging to `log_path`: (child, port)."""
    with log_path.open("w") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
        )
    assert child.stdin is not None and child.stdout is not None
    try:
        yield child, int(child.stdout.readline())
    finally:
        child.stdin.close()
        child.wait(timeout=5)
        child.stdout.close()


def _command(child: subprocess.Popen[str], command: str) -> int:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(command + "\n")
    child.stdin.flush()
    return int(child.stdout.readline())


def test_flood_past_the_fd_limit_is_survived_without_spinning(tmp_path: Path) -> None:
    """300 connections at a server with 64 fds: it evicts instead of spinning, and /healthz still answers."""
    with _fd_limited_server(tmp_path / "child.log") as (child, port), ExitStack() as stack:
        cpu_before, started = cpu_seconds(child.pid), time.monotonic()
        idle = _connect_many(stack, port, 300)
        time.sleep(max(0.0, started + 1.0 - time.monotonic()))  # a measurement: CPU over a second of flood
        cpu_s, wall_s = cpu_seconds(child.pid) - cpu_before, time.monotonic() - started

        assert _timed_healthz(port) < 1.0
        assert _count_closed_by_peer(idle, at_least=300 - 64, timeout_s=2.0) >= 300 - 64
        assert cpu_s < 0.3 * wall_s, f"server used {cpu_s:.2f}s of CPU in {wall_s:.2f}s"
    assert "EMFILE" in (tmp_path / "child.log").read_text()  # the flood did run it out of fds, logged once


def test_no_fd_to_free_pauses_accepting_instead_of_spinning(tmp_path: Path) -> None:
    """With every fd taken elsewhere, waiting connections cost no CPU, and are served once fds come back."""
    with _fd_limited_server(tmp_path / "child.log") as (child, port), ExitStack() as stack:
        assert _command(child, "hog") > 0
        cpu_before, started = cpu_seconds(child.pid), time.monotonic()
        waiting = _connect_many(stack, port, 20)  # the kernel completes them; the server cannot accept them
        time.sleep(1.0)  # a measurement: CPU over a second of connections it cannot accept
        cpu_s, wall_s = cpu_seconds(child.pid) - cpu_before, time.monotonic() - started
        assert cpu_s < 0.3 * wall_s, f"server used {cpu_s:.2f}s of CPU in {wall_s:.2f}s"

        assert _command(child, "free") == 0
        assert _timed_healthz(port) < 1.0
        assert not any(_closed_by_peer(s) for s in waiting)  # accepted, not evicted: there was room again
    assert (tmp_path / "child.log").read_text().count("EMFILE") == 1


def test_stop_is_prompt_and_releases_the_port() -> None:
    """stop() with idle clients connected returns within a second, stops the thread, and frees the port."""
    threads_before = _tasks()
    with ExitStack() as stack:
        server = idle_server()
        assert _tasks() == threads_before, "constructed idle"
        server.start()
        idle = _connect_many(stack, server.port, 10)
        _timed_healthz(server.port)
        started = time.monotonic()
        server.stop(SYSTEM_CLOCK.now() + 1.0)
        assert time.monotonic() - started < 1.0
        # The OS thread outlives join() briefly.
        wait_until(lambda: _tasks() == threads_before, 0.5, "the server's thread gone")
        assert all(_closed_by_peer(s, wait_s=1.0) for s in idle)
        with socket.create_server(("127.0.0.1", server.port)):
            pass
