"""A proxy in front of the test API server that can hold back what the server sends on WATCH requests: a slow
watch, for tests of what the agent does with a pod cache that looks healthy and is behind.

    with DelayingProxy(plane) as proxy:                       # 127.0.0.1:<proxy.port>, passing everything through
        cluster.helm_install(chart_values=cluster.api_values(proxy.port))   # the agent now reaches the API here
        proxy.watch_delay_s = 30.0                           # every byte a watch answers arrives 30 s late
        proxy.watch_delay_s = 0.0                            # ... or now, for what is still held

It terminates TLS with the API server's own serving certificate (issued for 127.0.0.1 by the cluster's CA, which the
agent's ServiceAccount volume carries as ca.crt), so a client that verifies the server sees no difference, and
opens a TLS connection of its own to the API server for each request, passing the client's headers on (its
bearer token authenticates it) with ``Connection: close`` in place of keep-alive: one request per connection, so
each connection is known to be a WATCH or not from its request line. The answer to a watch (``watch=true`` in the
query) is held until it is `watch_delay_s` old, its end too (a watch the API server ends, by its crash for one,
looks alive to the client meanwhile), in order; `watch_delay_s` is read again while a chunk waits, so lowering it to
0 lets out at once what is held: a watch that catches up. Everything else (LIST, GET, POST) passes at once; with
the API server down, a request reaches the proxy (and `requests`) and its connection is closed unanswered, as a
load balancer in front of a dead server does. The proxy runs an asyncio loop in a thread of the test process.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

from .controlplane import ControlPlane, free_port

_CHUNK = 64 * 1024
_HEAD_LIMIT = 1024 * 1024
_RECHECK_S = 0.1  # how often a held chunk looks at `watch_delay_s` again
# Headers the proxy drops from a request (it sends its own Connection: close).
_HOP_BY_HOP = (b"connection:", b"keep-alive:", b"proxy-connection:")


@dataclass(frozen=True, slots=True)
class ProxiedRequest:
    """One request the proxy passed on: when it came (time.monotonic()), its method, path and query, whether it is
    a WATCH, and the client's User-Agent."""

    at_s: float
    method: str
    path: str
    query: str
    watch: bool
    user_agent: str


class DelayingProxy:
    """`with DelayingProxy(plane) as proxy:` serves on 127.0.0.1:`proxy.port` until the block ends."""

    def __init__(self, plane: ControlPlane, *, watch_delay_s: float = 0.0) -> None:
        self.plane = plane
        self.port = free_port()
        # Read by the proxy's loop as each chunk of a watch's answer arrives: set it at any time.
        self.watch_delay_s = watch_delay_s
        self.requests: list[ProxiedRequest] = []  # appended by the loop's thread, read by the test's
        self.held_chunks = 0  # chunks of watch answers held back (delay > 0)
        upstream = plane.host.removeprefix("https://")
        self._upstream_host, port = upstream.rsplit(":", 1)
        self._upstream_port = int(port)
        self._server_ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_ssl.load_cert_chain(str(plane.serving_cert_path), str(plane.serving_key_path))
        self._upstream_ssl = ssl.create_default_context(cafile=str(plane.ca_path))
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(lambda loop, context: None)  # torn TLS connections are expected here
        self._thread = threading.Thread(target=self._loop.run_forever, name="delaying-proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def start(self) -> DelayingProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        """Close the listener and every connection, and end the loop. Idempotent."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> DelayingProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- what it saw ---------------------------------------------------------------------------------------------

    def seen(self, *, since_s: float = 0.0, path: str | None = None, watch: bool | None = None) -> list[ProxiedRequest]:
        """The requests that came at or after `since_s` (time.monotonic()), to `path` if given, WATCHes only or
        none if `watch` is given."""
        return [
            r
            for r in list(self.requests)
            if r.at_s >= since_s and (path is None or r.path == path) and (watch is None or r.watch == watch)
        ]

    # -- the loop ------------------------------------------------------------------------------------------------

    async def _listen(self) -> asyncio.AbstractServer:
        return await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, ssl=self._server_ssl, limit=_HEAD_LIMIT, reuse_address=True
        )

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=5)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head[:-4].split(b"\r\n")
        method, target, _version = request_line.decode("latin-1").split(" ", 2)
        url = urlsplit(target)
        watch = any(v.lower() in ("true", "1") for v in parse_qs(url.query).get("watch", []))
        user_agent = next(
            (
                h.split(b":", 1)[1].strip().decode("latin-1")
                for h in header_lines
                if h.lower().startswith(b"user-agent:")
            ),
            "",
        )
        self.requests.append(ProxiedRequest(time.monotonic(), method, url.path, url.query, watch, user_agent))
        kept = [h for h in header_lines if not h.lower().startswith(_HOP_BY_HOP)]
        up_reader, up_writer = await asyncio.open_connection(
            self._upstream_host, self._upstream_port, ssl=self._upstream_ssl, server_hostname=self._upstream_host
        )
        try:
            up_writer.write(b"\r\n".join([request_line, *kept, b"Connection: close"]) + b"\r\n\r\n")
            forward = asyncio.ensure_future(self._forward(reader, up_writer))
            try:
                await self._answer(up_reader, writer, watch)
            finally:
                forward.cancel()
        finally:
            up_writer.close()

    async def _forward(self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        """The rest of the request (its body) to the API server, as it comes."""
        with contextlib.suppress(OSError, ssl.SSLError):
            while chunk := await reader.read(_CHUNK):
                up_writer.write(chunk)
                await up_writer.drain()

    async def _answer(self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watch: bool) -> None:
        """The API server's answer to the client, in order, each chunk (and the end) once it is `watch_delay_s` old
        (for a watch; at once otherwise), as `watch_delay_s` is while it waits: lowering it lets out what is held."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def receive() -> None:
            while True:
                try:
                    chunk = await up_reader.read(_CHUNK)
                except (OSError, ssl.SSLError):
                    chunk = b""  # a torn connection ends the answer, as the server's close would
                if watch and self.watch_delay_s > 0 and chunk:
                    self.held_chunks += 1
                await queue.put((time.monotonic(), chunk))
                if not chunk:
                    return

        receiving = asyncio.ensure_future(receive())
        try:
            while True:
                arrived, chunk = await queue.get()
                while (wait := arrived + (self.watch_delay_s if watch else 0.0) - time.monotonic()) > 0:
                    await asyncio.sleep(min(wait, _RECHECK_S))
                if not chunk:
                    return
                writer.write(chunk)
                await writer.drain()
        finally:
            receiving.cancel()
