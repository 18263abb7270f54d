"""The agent's HTTP endpoint: /metrics for Prometheus, /healthz for liveness, /readyz for readiness (each with
`?verbose`, every named check listed), /status for people and tools (the status document, `status.py`).

One thread runs a `selectors` loop over non-blocking sockets, so that nothing that can reach the port can blind
the endpoint or starve the agent's loop: its CPU budgeted, bounded connections and fds, the oldest that costs
nothing to lose evicted, one deadline per connection, answers prepared elsewhere waited for without blocking, no
busy loop when out of fds (docs/architecture.md "The HTTP endpoint"). The kubelet does not come here: its probes
read the health file (`base/healthfile.py`), which no connection can delay. `start()` binds the port and starts the
thread; `stop(deadline)` resets every connection and releases the port. /metrics is client_python's own WSGI app, so it
speaks what Prometheus asks for (gzip, OpenMetrics, `name[]`).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import functools
import io
import os
import re
import select
import selectors
import socket
import struct
import termios
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import TypeVar

import structlog
from prometheus_client import CollectorRegistry, make_wsgi_app

from vramguard.agent.health import Checks
from vramguard.base.background import BackgroundLoop
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.heartbeat import Heartbeat
from vramguard.base.logs import FailureRun

_Answer = tuple[int, list[tuple[str, str]], bytes]  # (status, headers, body)
# An answer being prepared elsewhere: asked again on the server's thread after each `wake()`, until it gives one.
_Later = Callable[[], "_Answer | None"]
# (query string, the request headers read) → the answer, or a `_Later` for one that is not ready yet.
Route = Callable[[str, Mapping[str, str]], "_Answer | _Later"]
# The /status body (JSON) at once, or a callable that gives it once it is built (None until then), given the
# server's `wake` to call once it is. Called on the server's thread: it must never build anything there
# (`status.StatusPage` builds on a thread of its own).
StatusBody = Callable[[Callable[[], None]], "bytes | Callable[[], bytes | None]"]

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
# The loop looks at its clock this often when nothing else wakes it (stop() wakes it through the wake pipe).
_TICK_S = 0.1
# How long the listening socket goes unpolled when no fd can be had: long enough to cost nothing, short
# enough that a scrape arriving once fds are free again is answered well within its timeout.
_ACCEPT_PAUSE_S = 0.1
_RECV_BYTES = 16 * 1024
# Input left unread when a socket is closed turns the FIN into a RST, which can destroy the response before the
# client has read it; so after answering we read and discard until the client closes, up to this much.
_DRAIN_LIMIT_BYTES = 64 * 1024
# accept() failures that concern one connection only (accept(2) passes on the network errors pending on it).
_PEER_GONE = frozenset(
    {
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.EPERM,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ENOPROTOOPT,
        errno.EOPNOTSUPP,
    }
)
_OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE})
_LINGER_ABORT = struct.pack("ii", 1, 0)  # struct linger {l_onoff = 1, l_linger = 0}: close() sends RST
# The loop's CPU is budgeted per window: past `max_cpu_fraction` of a window, no connection is accepted until the
# next one (they wait in the kernel's backlog). Short windows keep a client queued behind a flood waiting little.
_BUDGET_WINDOW_S = 0.1
# The gate closes at this share of the budget: the connections already taken, the rounds gone while closed and the
# last window's unpaid debt spend the rest, so that the thread's CPU over a flood stays under the fraction, not at it.
_GATE_SHARE = 0.9
_WAKE = object()  # the selector key data of the wake pipe
_WAIT_S = 2.0  # a connection waits this long at most for an answer prepared elsewhere, then gets a 503
_T = TypeVar("_T")
# The head ends at the first empty line; bare LF line ends are accepted (RFC 9112 §2.2).
_HEAD_END = re.compile(rb"\r?\n\r?\n")
# Origin-form only (`/path?query`): probes and scrapes never send another form. Methods are case-sensitive.
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (/[\x21-\x7e]*) HTTP/1\.[0-9]")
# The request headers read, as their WSGI environ keys; every other header is skipped.
_READ_HEADERS = {b"accept": "HTTP_ACCEPT", b"accept-encoding": "HTTP_ACCEPT_ENCODING"}


class _Phase(enum.Enum):
    READ = "read"  # collecting the request head
    WAIT = "wait"  # its answer is being prepared elsewhere (`_Later`); nothing is read or written meanwhile
    WRITE = "write"  # sending the response
    DRAIN = "drain"  # response sent and write side shut; discarding input until the client closes


@dataclass(slots=True, eq=False)
class _Listener:
    """The listening socket, the routes it serves, and the connections taken from it with their bound."""

    port: int
    routes: Mapping[str, Route]
    max_connections: int
    sock: socket.socket | None = None
    pending: select.poll = field(default_factory=select.poll)  # asks whether a connection waits, without accepting it
    # In accept order, so the first is both the oldest and the one with the earliest deadline.
    conns: dict[int, _Conn] = field(default_factory=dict)
    watched: bool = False
    paused_until: float | None = None  # out of fds: unpolled until then


class BindError(OSError):
    """The port could not be bound: `port` (as asked for) says which."""

    def __init__(self, port: int, error: OSError) -> None:
        super().__init__(error.errno, error.strerror)
        self.port = port


@dataclass(slots=True, eq=False)
class _Conn:
    sock: socket.socket
    fd: int
    deadline: float
    accept_round: int  # never evicted in the round that accepted it: it has not been read yet
    listener: _Listener
    phase: _Phase = _Phase.READ
    events: int = selectors.EVENT_READ
    received: bytearray = field(default_factory=bytearray)
    unsent: memoryview = field(default_factory=lambda: memoryview(b""))
    drained_bytes: int = 0
    path: str = ""
    head_only: bool = False  # a HEAD request: the answer without its body
    later: _Later | None = None  # in WAIT: asked again after each wake
    wait_until: float = 0.0  # in WAIT: then a 503 answers it
    delivered: bool = False  # in DRAIN: the peer has acknowledged the whole response
    asked_round: int = -1  # the accept round in which the kernel was last asked whether it was


class HealthServer:
    """Serves metrics, the probes' answers for people and /status on one background thread from `start()` to
    `stop(deadline)`.

    `max_connections` bounds the open client connections (and so the fds), `request_timeout_s` the whole exchange
    on each, from accept to the last byte written (on `clock`), and `max_request_bytes` the request head. `port`
    0 picks a free one: `port` says which once started. `status`, where given, answers /status. The thread's CPU
    is held to `max_cpu_fraction` of a core: a flood of clients waits in the kernel's backlog rather than taking
    the node's CPU. `progress`, where given, is told of each round the thread completes: a wedged thread stops
    telling it (liveness), a busy one does not.
    """

    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        healthz: Checks,
        readyz: Checks,
        host: str = "",
        *,
        status: StatusBody | None = None,
        progress: Heartbeat | None = None,
        max_connections: int = 64,
        request_timeout_s: float = 5.0,
        max_request_bytes: int = 8192,
        max_cpu_fraction: float = 0.15,
        clock: Clock = SYSTEM_CLOCK,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        if max_connections < 1 or request_timeout_s <= 0 or max_request_bytes < 64 or not 0 < max_cpu_fraction <= 1:
            raise ValueError(
                "need max_connections >= 1, request_timeout_s > 0, max_request_bytes >= 64 "
                "and 0 < max_cpu_fraction <= 1"
            )
        routes: dict[str, Route] = {
            "/metrics": _wsgi_route(make_wsgi_app(registry)),
            "/healthz": lambda query, headers: _probe(healthz, query),
            "/readyz": lambda query, headers: _probe(readyz, query),
        }
        if status is not None:
            routes["/status"] = lambda query, headers: _json_route(status, self.wake)
        self._main = _Listener(port, routes, max_connections)
        self._progress = progress
        self._request_timeout_s = request_timeout_s
        self._max_request_bytes = max_request_bytes
        self._cpu_budget_s = _GATE_SHARE * max_cpu_fraction * _BUDGET_WINDOW_S
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.host = host
        self.port = port
        self._selector = selectors.PollSelector()  # no fd of its own, unlike epoll; a few dozen fds poll cheaply
        self._round = 0
        self._window_end = 0.0  # the CPU budget's window: its end (time.monotonic) and the thread's CPU at its start
        self._window_cpu_s = 0.0
        # Logged once per run of failures: under attack the same failure repeats thousands of times a second.
        self._route_failures: dict[str, FailureRun] = {}
        self._accept_failures = FailureRun()  # a run ends once the backlog is drained without an error
        self._connection_bugs = FailureRun()
        self._waiting: set[_Conn] = set()  # connections in WAIT
        self._wake_r, self._wake_w = -1, -1
        self._loop = BackgroundLoop(
            "vramguard-http", self._step, clock=clock, wake=self.wake, on_exit=self._close, log=self.log
        )

    def start(self) -> None:
        """Bind the port (raises BindError) and start serving."""
        listener = self._main
        try:
            listener.sock = _bound(self.host, listener.port)
        except OSError as e:
            raise BindError(listener.port, e) from None
        listener.port = self.port = listener.sock.getsockname()[1]
        listener.pending.register(listener.sock, select.POLLIN)
        self._watch_listener(listener, True)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._loop.start()

    def wake(self) -> None:
        """An answer a connection waits for may be ready (any thread may call this; it never blocks)."""
        with contextlib.suppress(OSError):  # a full pipe has a wake pending already; a closed one, no server
            os.write(self._wake_w, b"!")

    def stop(self, deadline: float) -> None:
        """Stop serving, reset every connection and release the port, once the round under way ends (the wake
        pipe ends its wait); waits for the thread until `deadline` at most (a callback stuck on the loop thread keeps
        the port until it returns)."""
        self._loop.stop(deadline)

    # One round: expire, wait, serve the clients that are ready, then accept.

    def _step(self) -> float:
        now = self.clock.now()
        if self._progress is not None:
            self._progress.beat(now)
        self._expire(now)
        listener = self._main
        if listener.paused_until is not None and now >= listener.paused_until:
            listener.paused_until = None
        self._watch_listener(listener, self._may_accept(listener, self._over_budget()))
        ready = self._selector.select(self._timeout_s(now))
        now = self.clock.now()
        woken = False
        accept = False
        for key, _ in ready:
            if key.data is listener:
                accept = True
            elif key.data is _WAKE:
                woken = True
            else:
                self._service(key.data)
        if woken or self._waiting:
            self._answer_waiting(now, woken)
        # Clients first: a connection accepted last round is read before a new one can evict it.
        if accept and listener.watched:
            self._accept(listener, now)
        return 0.0  # the select was the wait

    def _may_accept(self, listener: _Listener, over_budget: bool) -> bool:
        """Whether to watch `listener` this round: not paused for fds, within the CPU budget and with room for a
        connection."""
        return listener.paused_until is None and not over_budget and self._room(listener)

    def _close(self) -> None:
        """After the last round, on the loop's thread: reset every connection, release the port and the wake pipe."""
        for conn in list(self._main.conns.values()):
            self._drop(conn, abort=True)
        self._selector.close()
        assert self._main.sock is not None
        self._main.sock.close()
        wake_r, wake_w = self._wake_r, self._wake_w
        self._wake_r, self._wake_w = -1, -1  # a late wake() must not write to an fd number reused elsewhere
        os.close(wake_r)
        os.close(wake_w)

    def _timeout_s(self, now: float) -> float:
        # At most `_TICK_S` of real time, whatever the clock says: the loop looks at the clock again then.
        timeout_s = _TICK_S
        listener = self._main
        oldest = next(iter(listener.conns.values()), None)
        if oldest is not None:
            timeout_s = min(timeout_s, oldest.deadline - now)
        if listener.paused_until is not None:
            timeout_s = min(timeout_s, listener.paused_until - now)
        elif not listener.watched:
            timeout_s = min(timeout_s, self._window_end - time.monotonic())
        for conn in self._waiting:
            timeout_s = min(timeout_s, conn.wait_until - now)
        return max(timeout_s, 0.0)

    def _expire(self, now: float) -> None:
        # Deadlines grow in accept order, so the expired ones are a prefix.
        conns = self._main.conns
        while (oldest := next(iter(conns.values()), None)) is not None and oldest.deadline <= now:
            self._drop(oldest, abort=True)

    # Accepting.

    def _accept(self, listener: _Listener, now: float) -> None:
        """Takes waiting connections, evicting the oldest to stay within the listener's cap and the fd limit."""
        self._round += 1
        evicted_for_fd = False
        # At most a cap's worth per round, so nothing accepted this round is evicted before it has been read.
        for _ in range(listener.max_connections):
            # At the cap, evict before accepting, so the fd count never passes the cap + 1 even for a moment; but
            # only for a connection that is there to take, or each round would evict one too many.
            if len(listener.conns) >= listener.max_connections and not (
                self._pending(listener) and self._evict_one(listener)
            ):
                return
            assert listener.sock is not None
            try:
                sock, _ = listener.sock.accept()
            except BlockingIOError:
                self._accept_failures.ok()  # the backlog is drained: a run of accept failures is over
                return
            except OSError as e:
                if e.errno in _PEER_GONE:
                    continue
                # An agent out of fds is worth a line, not one per attempt while it lasts.
                name = errno.errorcode.get(e.errno or 0, "?")
                if self._accept_failures.failed(name):
                    self.log.warning("http_accept_failed", error=name)
                if e.errno in _OUT_OF_FDS and listener.conns and not evicted_for_fd:
                    if not self._evict_one(listener):
                        return  # every connection is from this round: read them, then go on evicting
                    evicted_for_fd = True
                    continue
                self._pause_accepting(listener, now)
                return
            evicted_for_fd = False
            self._add(listener, sock, now)

    def _pending(self, listener: _Listener) -> bool:
        return bool(listener.pending.poll(0))

    def _evict_one(self, listener: _Listener) -> bool:
        """Close one of the listener's connections to make room, the oldest of those that cost nothing to lose
        (`_evictable`), but never one accepted in this round: it has not been read yet."""
        for conn in listener.conns.values():
            if conn.accept_round == self._round:
                return False  # accept order: the rest are from this round too
            if self._evictable(conn):
                self._drop(conn, abort=True)
                return True
        return False

    def _room(self, listener: _Listener) -> bool:
        """Whether the listener can take a connection now or by evicting one; else the rest wait in the backlog
        until a slot frees (every slot holds one waiting for its answer, or an answer still on its way)."""
        conns = listener.conns
        return len(conns) < listener.max_connections or any(self._evictable(c) for c in conns.values())

    def _evictable(self, conn: _Conn) -> bool:
        """One that has not sent its whole request (idle, or trickling), or one already answered whose answer has
        left this host (nothing in its send queue: a reset can no longer destroy it). The kernel is asked once a
        round at most for each connection: under a flood this is asked of every slot again and again."""
        if conn.phase is _Phase.DRAIN and not conn.delivered and conn.asked_round != self._round:
            conn.asked_round = self._round
            conn.delivered = _unsent_bytes(conn.sock) == 0  # once true, it stays so: nothing more is sent
        return conn.phase is _Phase.READ or conn.delivered

    def _pause_accepting(self, listener: _Listener, now: float) -> None:
        # Polling a listening socket that stays readable while accept() keeps failing is a busy loop.
        listener.paused_until = now + _ACCEPT_PAUSE_S
        self._watch_listener(listener, False)

    def _watch_listener(self, listener: _Listener, watched: bool) -> None:
        """Watch a listening socket for connections, or stop watching it (they wait in the backlog)."""
        if watched != listener.watched:
            assert listener.sock is not None
            if watched:
                self._selector.register(listener.sock, selectors.EVENT_READ, listener)
            else:
                self._selector.unregister(listener.sock)
            listener.watched = watched

    def _over_budget(self) -> bool:
        """Whether the thread has used its CPU for the current budget window (real time and the thread's own CPU
        time: neither is the injected clock, which measures neither)."""
        mono, cpu_s = time.monotonic(), time.thread_time()
        if mono >= self._window_end:
            # What a window spent past its budget (the connections it had kept being served) is the next one's debt,
            # so that the budget holds over time, not just per window.
            debt_s = max(0.0, cpu_s - self._window_cpu_s - self._cpu_budget_s) if self._window_end else 0.0
            self._window_end, self._window_cpu_s = mono + _BUDGET_WINDOW_S, cpu_s - min(debt_s, self._cpu_budget_s * 10)
        return cpu_s - self._window_cpu_s > self._cpu_budget_s

    def _add(self, listener: _Listener, sock: socket.socket, now: float) -> None:
        sock.setblocking(False)
        conn = _Conn(sock, sock.fileno(), now + self._request_timeout_s, self._round, listener)
        listener.conns[conn.fd] = conn
        self._selector.register(sock, conn.events, conn)
        self._service(conn)  # its request is most often there already: answered now, not a poll later

    def _drop(self, conn: _Conn, *, abort: bool = False) -> None:
        if conn.listener.conns.get(conn.fd) is not conn:
            return  # dropped already (a close that raised, say), its fd perhaps reused: twice must not kill the loop
        del conn.listener.conns[conn.fd]
        self._waiting.discard(conn)
        self._selector.unregister(conn.sock)
        if abort:
            # Reset rather than FIN: the kernel frees the connection's buffers now (a never-reading client could
            # otherwise pin megabytes of /metrics per orphaned socket) and keeps no FIN-WAIT state for it.
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
        conn.sock.close()

    # One connection: read the head, answer, write, drain.

    def _service(self, conn: _Conn) -> None:
        try:
            if conn.phase is _Phase.READ:
                self._read(conn)
            elif conn.phase is _Phase.WRITE:
                self._write(conn)
            elif conn.phase is _Phase.DRAIN:
                self._drain(conn)
            else:  # DRAIN, or WAIT: input past the request is not for us, and a client that closes is dropped
                self._drain(conn)
        except OSError:  # reset, broken pipe: the client is gone
            self._drop(conn)
        except Exception as e:  # a bug here costs one connection, never the endpoint
            # The type only: a message could quote request bytes.
            if self._connection_bugs.failed(type(e).__name__):
                self.log.warning("http_connection_failed", error=type(e).__name__)
            self._drop(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(self._max_request_bytes + 1 - len(conn.received))
        except BlockingIOError:
            return
        if not chunk:
            self._drop(conn)  # closed before finishing its request: nobody to answer
            return
        conn.received += chunk
        head = _head_of(conn.received)
        if head is not None:
            answer = self._answer(conn, head)
            if isinstance(answer, bytes):
                self._respond(conn, answer)
        elif len(conn.received) > self._max_request_bytes:
            self._respond(conn, _render(431, _text(), b"request head too large\n"))

    def _answer(self, conn: _Conn, head: bytes) -> bytes | None:
        """The response to the request `head`, or None when its answer is being prepared: `conn` then waits."""
        conn.path, conn.head_only, answer = self._request(head, conn.listener.routes)
        if isinstance(answer, bytes):
            return answer
        conn.later, conn.phase = answer, _Phase.WAIT
        conn.wait_until = self.clock.now() + min(_WAIT_S, self._request_timeout_s / 2)
        self._waiting.add(conn)
        return self._ask_again(conn)

    def _request(self, head: bytes, routes: Mapping[str, Route]) -> tuple[str, bool, bytes | _Later]:
        """(path, HEAD or not, the response) for the request `head` to a port serving `routes`; the response is a
        `_Later` when its route prepares it elsewhere. The path is "" for a request no route is looked up for."""
        match = _REQUEST_LINE.fullmatch(head.split(b"\n", 1)[0].rstrip(b"\r"))
        if match is None:
            return "", False, _render(400, _text(), b"malformed request line\n")
        method, target = match.group(1), match.group(2)
        if method not in (b"GET", b"HEAD"):
            return "", False, _render(405, [*_text(), ("Allow", "GET, HEAD")], b"only GET and HEAD\n")
        path, _, query = target.decode("ascii").partition("?")
        head_only = method == b"HEAD"
        route = routes.get(path)
        if route is None:
            return path, head_only, _render(404, _text(), b"not found\n", head_only=head_only)
        answer = self._call(path, lambda: route(query, _headers(head)))
        if callable(answer):
            return path, head_only, answer
        return path, head_only, _render(*answer, head_only=head_only)

    def _call(self, path: str, route: Callable[[], _T]) -> _T | _Answer:
        """`route()`, or a 500 naming the route when it raises."""
        failures = self._route_failures.setdefault(path, FailureRun())
        try:
            answer = route()
        except Exception as e:
            # Logged when a route starts failing (or fails another way), not on every scrape while it keeps failing.
            if failures.failed(type(e).__name__):
                self.log.error("http_route_failed", path=path, error=repr(e))
            return 500, _text(), f"{path[1:]} failed: {type(e).__name__}\n".encode()
        failures.ok()
        return answer

    # Answers prepared elsewhere.

    def _ask_again(self, conn: _Conn) -> bytes | None:
        """The waiting connection's response if its answer is ready now (it leaves WAIT), else None."""
        assert conn.later is not None
        answer = self._call(conn.path, conn.later)
        if answer is None:
            return None
        self._waiting.discard(conn)
        conn.later = None
        return _render(*answer, head_only=conn.head_only)

    def _answer_waiting(self, now: float, woken: bool) -> None:
        """Answer the waiting connections whose answers are ready (after a wake), and those that waited too long."""
        if woken:
            with contextlib.suppress(OSError):
                while os.read(self._wake_r, 4096):
                    pass
        for conn in list(self._waiting):
            response = self._ask_again(conn) if woken else None
            if response is None and now >= conn.wait_until:
                self._waiting.discard(conn)
                response = _render(
                    503, _text(), f"{conn.path[1:]} not ready in time\n".encode(), head_only=conn.head_only
                )
            if response is not None:
                self._respond(conn, response)

    def _respond(self, conn: _Conn, response: bytes) -> None:
        conn.phase = _Phase.WRITE
        conn.unsent = memoryview(response)
        self._write(conn)  # most answers fit the socket buffer: no need to wait for a poll

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.unsent)
        except BlockingIOError:
            sent = 0
        conn.unsent = conn.unsent[sent:]
        if conn.unsent:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        conn.sock.shutdown(socket.SHUT_WR)  # the FIN ends the response (with Content-Length) for the client
        conn.phase = _Phase.DRAIN
        if self._evictable(conn):
            # The client's kernel has acknowledged the whole response: nothing a close does can destroy it now, so
            # the slot is not held until the client closes (a third of a connection's cost under a flood).
            self._drop(conn)
            return
        self._watch(conn, selectors.EVENT_READ)
        self._drain(conn)  # the client may have closed already

    def _drain(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(_RECV_BYTES)
        except BlockingIOError:
            return
        conn.drained_bytes += len(chunk)
        if not chunk:
            self._drop(conn)
        elif conn.drained_bytes > _DRAIN_LIMIT_BYTES:
            self._drop(conn, abort=True)

    def _watch(self, conn: _Conn, events: int) -> None:
        if conn.events != events:
            conn.events = events
            self._selector.modify(conn.sock, events, conn)


def _bound(host: str, port: int) -> socket.socket:
    """A non-blocking listening socket on (host, port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # A deep backlog lets the kernel, not our fds, hold a burst of connections until the loop takes them.
    sock = socket.create_server((host, port), family=family, backlog=socket.SOMAXCONN)
    # The kernel hands over a connection once its request has arrived (or after a few seconds without one): a
    # flood of clients that connect before they send is not a flood of idle connections to evict.
    with contextlib.suppress(AttributeError, OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 1)
    sock.setblocking(False)
    return sock


def _head_of(received: bytes | bytearray) -> bytes | None:
    """The request head without the empty line that ends it, or None until that line has come. Blank lines before
    the request line are skipped (RFC 9112 §2.2)."""
    head = bytes(received).lstrip(b"\r\n")
    end = _HEAD_END.search(head)
    return None if end is None else head[: end.start()]


def _unsent_bytes(sock: socket.socket) -> int:
    """Bytes of the response the peer has not acknowledged yet (SIOCOUTQ); -1 when the kernel cannot say."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]  # type: ignore[no-any-return]
    except OSError:
        return -1


def _json_route(status: StatusBody, wake: Callable[[], None]) -> _Answer | _Later:
    """/status: the body now, or a `_Later` that gives it once built (`wake` is called then)."""
    body = status(wake)
    if isinstance(body, bytes):
        return 200, [("Content-Type", _JSON)], body
    later = body

    def when_built() -> _Answer | None:
        built = later()
        return None if built is None else (200, [("Content-Type", _JSON)], built)

    return when_built


def _probe(checks: Checks, query: str) -> _Answer:
    """The checks' answer, which says why where it fails (`curl /readyz` says what is missing); with `?verbose`,
    every check on a line of its own."""
    verbose = "verbose" in (field.partition("=")[0] for field in query.split("&"))
    ok, why = checks.listing() if verbose else checks()
    return (200 if ok else 503), _text(), (why + "\n").encode()


def _text() -> list[tuple[str, str]]:
    return [("Content-Type", _TEXT)]


def _headers(head: bytes) -> dict[str, str]:
    """The request headers the routes read (`_READ_HEADERS`), as WSGI environ entries; the rest is skipped."""
    found: dict[str, str] = {}
    for line in head.split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        key = _READ_HEADERS.get(name.strip().lower()) if colon else None
        if key is not None:
            found[key] = value.strip().decode("latin-1")
    return found


def _wsgi_route(app: Callable[[dict[str, object], Callable[..., object]], Iterable[bytes]]) -> Route:
    """A route that answers through a WSGI app (client_python's metrics app), called on the loop thread."""

    def route(query: str, headers: Mapping[str, str]) -> _Answer:
        environ: dict[str, object] = {
            "REQUEST_METHOD": "GET",  # HEAD as well: the body is dropped when the response is rendered
            "SCRIPT_NAME": "",
            "PATH_INFO": "/metrics",
            "QUERY_STRING": query,
            "SERVER_NAME": "vramguard",
            "SERVER_PORT": "0",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(),
            "wsgi.errors": io.StringIO(),
            "wsgi.multithread": False,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            **headers,
        }
        started: list[tuple[str, list[tuple[str, str]]]] = []

        def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: object = None) -> None:
            started.append((status, response_headers))

        body = b"".join(app(environ, start_response))
        status, response_headers = started[-1]
        return int(status.split(" ", 1)[0]), list(response_headers), body

    return route


@functools.lru_cache(maxsize=2)
def _http_date(epoch_s: int) -> str:
    """The Date header's value for that second (formatted once a second, not once a response)."""
    return formatdate(epoch_s, usegmt=True)


def _render(status: int, headers: list[tuple[str, str]], body: bytes, *, head_only: bool = False) -> bytes:
    """A complete HTTP/1.1 response; HEAD gets the headers (Content-Length included) without the body. The
    framing headers (Date, Content-Length, Connection) are this server's, whatever a route says."""
    framing = {"date", "content-length", "connection", "transfer-encoding"}
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"Date: {_http_date(int(time.time()))}",
        *(f"{name}: {value}" for name, value in headers if name.lower() not in framing),
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body
