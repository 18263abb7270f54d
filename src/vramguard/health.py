"""The agent's HTTP endpoint: /metrics for Prometheus, /healthz for liveness, /readyz for readiness, /status for
people and tools (the status document, `status.py`).

One thread runs a `selectors` loop over non-blocking sockets, so that nothing that can reach the port can blind
the endpoint or starve the agent's loop: bounded connections and fds, the oldest evicted, one deadline per
connection, no busy loop when out of fds (docs/design.md "The HTTP endpoint"). `start()` binds the port and
starts the thread; `stop(deadline)` resets every connection and releases the port. /metrics is client_python's
own WSGI app, so it speaks what Prometheus asks for (gzip, OpenMetrics, `name[]`).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import io
import re
import select
import selectors
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

import structlog
from prometheus_client import CollectorRegistry, make_wsgi_app

from vramguard.clock import SYSTEM_CLOCK, Clock
from vramguard.logs import FailureRun

# Returns (ok, explanation) — the explanation is the response body, so `curl /readyz` says what is missing.
Probe = Callable[[], tuple[bool, str]]
_Answer = tuple[int, list[tuple[str, str]], bytes]  # (status, headers, body)
Route = Callable[[str, Mapping[str, str]], _Answer]  # (query string, the request headers read) → answer
# The /status body (JSON), built on the server's thread: it must be bounded in size and cheap when called often.
StatusBody = Callable[[], bytes]

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
# The loop checks for stop() (and looks at its clock) this often when nothing else wakes it.
_TICK_S = 0.1
# How long the listening socket goes unpolled when no fd can be had: long enough to cost nothing, short
# enough that a probe arriving once fds are free again is answered well within its timeout.
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
# The head ends at the first empty line; bare LF line ends are accepted (RFC 9112 §2.2).
_HEAD_END = re.compile(rb"\r?\n\r?\n")
# Origin-form only (`/path?query`): probes and scrapes never send another form. Methods are case-sensitive.
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (/[\x21-\x7e]*) HTTP/1\.[0-9]")
# The request headers read, as their WSGI environ keys; every other header is skipped.
_READ_HEADERS = {b"accept": "HTTP_ACCEPT", b"accept-encoding": "HTTP_ACCEPT_ENCODING"}


class _Phase(enum.Enum):
    READ = "read"  # collecting the request head
    WRITE = "write"  # sending the response
    DRAIN = "drain"  # response sent and write side shut; discarding input until the client closes


@dataclass(slots=True, eq=False)
class _Conn:
    sock: socket.socket
    fd: int
    deadline: float
    accept_round: int  # never evicted in the round that accepted it: it has not been read yet
    phase: _Phase = _Phase.READ
    events: int = selectors.EVENT_READ
    received: bytearray = field(default_factory=bytearray)
    unsent: memoryview = field(default_factory=lambda: memoryview(b""))
    drained_bytes: int = 0


class HealthServer:
    """Serves metrics and probes on one background thread from `start()` to `stop(deadline)`.

    `max_connections` bounds the open client connections (and so the fds), `request_timeout_s` the whole exchange
    on each, from accept to the last byte written (on `clock`), and `max_request_bytes` the request head. `port`
    0 picks a free one: `port` says which once started. `status`, where given, answers /status.
    """

    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        healthz: Probe,
        readyz: Probe,
        host: str = "",
        *,
        status: StatusBody | None = None,
        max_connections: int = 64,
        request_timeout_s: float = 5.0,
        max_request_bytes: int = 8192,
        clock: Clock = SYSTEM_CLOCK,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        if max_connections < 1 or request_timeout_s <= 0 or max_request_bytes < 64:
            raise ValueError("need max_connections >= 1, request_timeout_s > 0 and max_request_bytes >= 64")
        self._routes: dict[str, Route] = {
            "/metrics": _wsgi_route(make_wsgi_app(registry)),
            "/healthz": lambda query, headers: _probe(healthz),
            "/readyz": lambda query, headers: _probe(readyz),
        }
        if status is not None:
            self._routes["/status"] = lambda query, headers: (200, [("Content-Type", _JSON)], status())
        self._max_connections = max_connections
        self._request_timeout_s = request_timeout_s
        self._max_request_bytes = max_request_bytes
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger("vramguard.http")
        self.host = host
        self.port = port
        self._selector = selectors.PollSelector()  # no fd of its own, unlike epoll; a few dozen fds poll cheaply
        self._listener_poll = select.poll()  # asks whether a connection waits, without accepting it
        # In accept order, so the first is both the oldest and the one with the earliest deadline.
        self._conns: dict[int, _Conn] = {}
        self._round = 0
        self._accept_paused_until: float | None = None
        # Logged once per run of failures: under attack the same failure repeats thousands of times a second.
        self._route_failures: dict[str, FailureRun] = {}
        self._accept_failures = FailureRun()  # a run ends once the backlog is drained without an error
        self._connection_bugs = FailureRun()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="vramguard-http", daemon=True)

    def start(self) -> None:
        """Bind the port (raises OSError when it cannot) and start serving."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # A deep backlog lets the kernel, not our fds, hold a burst of connections until the loop takes them.
        self._listener = socket.create_server((self.host, self.port), family=family, backlog=socket.SOMAXCONN)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._listener_poll.register(self._listener, select.POLLIN)
        self._thread.start()

    def stop(self, deadline: float) -> None:
        """Stop serving, reset every connection and release the port, within about `_TICK_S`; waits for the
        thread until `deadline` at most (a callback stuck on the loop thread keeps the port until it returns)."""
        self._stopping.set()
        if self._thread.ident is not None:
            self._thread.join(max(0.0, deadline - self.clock.now()))

    # The loop: expire, wait, serve the clients that are ready, then accept.

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                now = self.clock.now()
                self._expire(now)
                if self._accept_paused_until is not None and now >= self._accept_paused_until:
                    self._accept_paused_until = None
                    self._selector.register(self._listener, selectors.EVENT_READ)
                ready = self._selector.select(self._timeout_s(now))
                now = self.clock.now()
                listener_ready = False
                for key, _ in ready:
                    if key.data is None:
                        listener_ready = True
                    else:
                        self._service(key.data)
                # Clients first: a connection accepted last round is read before a new one can evict it.
                if listener_ready:
                    self._accept(now)
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn, abort=True)
            self._selector.close()
            self._listener.close()

    def _timeout_s(self, now: float) -> float:
        # At most `_TICK_S` of real time, whatever the clock says: the loop looks at the clock again then.
        timeout_s = _TICK_S
        oldest = next(iter(self._conns.values()), None)
        if oldest is not None:
            timeout_s = min(timeout_s, oldest.deadline - now)
        if self._accept_paused_until is not None:
            timeout_s = min(timeout_s, self._accept_paused_until - now)
        return max(timeout_s, 0.0)

    def _expire(self, now: float) -> None:
        # Deadlines grow in accept order, so the expired ones are a prefix.
        while (oldest := next(iter(self._conns.values()), None)) is not None and oldest.deadline <= now:
            self._drop(oldest, abort=True)

    # Accepting.

    def _accept(self, now: float) -> None:
        """Takes waiting connections, evicting the oldest to stay within `max_connections` and the fd limit."""
        self._round += 1
        evicted_for_fd = False
        # At most a cap's worth per round, so nothing accepted this round is evicted before it has been read.
        for _ in range(self._max_connections):
            # At the cap, evict before accepting, so the fd count never passes max_connections + 1 even for a
            # moment; but only for a connection that is there to take, or each round would evict one too many.
            if len(self._conns) >= self._max_connections and not (self._pending() and self._evict_oldest()):
                return
            try:
                sock, _ = self._listener.accept()
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
                if e.errno in _OUT_OF_FDS and self._conns and not evicted_for_fd:
                    if not self._evict_oldest():
                        return  # every connection is from this round: read them, then go on evicting
                    evicted_for_fd = True
                    continue
                self._pause_accepting(now)
                return
            evicted_for_fd = False
            self._add(sock, now)

    def _pending(self) -> bool:
        return bool(self._listener_poll.poll(0))

    def _evict_oldest(self) -> bool:
        oldest = next(iter(self._conns.values()), None)
        if oldest is None or oldest.accept_round == self._round:
            return False
        self._drop(oldest, abort=True)
        return True

    def _pause_accepting(self, now: float) -> None:
        # Polling a listening socket that stays readable while accept() keeps failing is a busy loop.
        self._selector.unregister(self._listener)
        self._accept_paused_until = now + _ACCEPT_PAUSE_S

    def _add(self, sock: socket.socket, now: float) -> None:
        sock.setblocking(False)
        conn = _Conn(sock, sock.fileno(), now + self._request_timeout_s, self._round)
        self._conns[conn.fd] = conn
        self._selector.register(sock, conn.events, conn)

    def _drop(self, conn: _Conn, *, abort: bool = False) -> None:
        if self._conns.get(conn.fd) is not conn:
            return  # dropped already (a close that raised, say), its fd perhaps reused: twice must not kill the loop
        del self._conns[conn.fd]
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
            else:
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
        # Blank lines before the request line are skipped (RFC 9112 §2.2).
        head = bytes(conn.received).lstrip(b"\r\n")
        end = _HEAD_END.search(head)
        if end is not None:
            self._respond(conn, self._answer(head[: end.start()]))
        elif len(conn.received) > self._max_request_bytes:
            self._respond(conn, _render(431, _text(), b"request head too large\n"))

    def _answer(self, head: bytes) -> bytes:
        match = _REQUEST_LINE.fullmatch(head.split(b"\n", 1)[0].rstrip(b"\r"))
        if match is None:
            return _render(400, _text(), b"malformed request line\n")
        method, target = match.group(1), match.group(2)
        if method not in (b"GET", b"HEAD"):
            return _render(405, [*_text(), ("Allow", "GET, HEAD")], b"only GET and HEAD\n")
        path, _, query = target.decode("ascii").partition("?")
        route = self._routes.get(path)
        if route is None:
            return _render(404, _text(), b"not found\n", head_only=method == b"HEAD")
        failures = self._route_failures.setdefault(path, FailureRun())
        try:
            status, headers, body = route(query, _headers(head))
        except Exception as e:
            # Logged when a route starts failing (or fails another way), not on every scrape while it keeps failing.
            if failures.failed(type(e).__name__):
                self.log.error("http_route_failed", path=path, error=repr(e))
            status, headers, body = 500, _text(), f"{path[1:]} failed: {type(e).__name__}\n".encode()
        else:
            failures.ok()
        return _render(status, headers, body, head_only=method == b"HEAD")

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


def _probe(probe: Probe) -> _Answer:
    ok, why = probe()
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


def _render(status: int, headers: list[tuple[str, str]], body: bytes, *, head_only: bool = False) -> bytes:
    """A complete HTTP/1.1 response; HEAD gets the headers (Content-Length included) without the body. The
    framing headers (Date, Content-Length, Connection) are this server's, whatever a route says."""
    framing = {"date", "content-length", "connection", "transfer-encoding"}
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"Date: {formatdate(usegmt=True)}",
        *(f"{name}: {value}" for name, value in headers if name.lower() not in framing),
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body
