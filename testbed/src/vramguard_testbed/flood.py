"""A tenant's flood of the agent's port: thousands of connections of one kind, and /status readers besides.

    python -m vramguard_testbed.flood HOST PORT KIND CONNECTIONS SECONDS [STATUS_READERS]

KIND is what each of the CONNECTIONS does, over and over until SECONDS are up:
- hammer: a whole `GET /healthz`, read the answer, reconnect at once;
- loris: a request line, then one byte a second, until the server gives up on it; then again;
- idle: connect and send nothing, until the server (or the kernel) drops it; then again.
STATUS_READERS more ask for /status, read it to its end and ask again. One JSON line on standard output says what
the flood got: connections made, answers by status code, failures, and how long the answered waited.

Standard library only, and one file: the real-node test runs it in a pod from the agent's image (`python3 -c`).
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import sys
import time

CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 10.0
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"
STATUS = b"GET /status HTTP/1.1\r\nHost: agent\r\n\r\n"


class Tally:
    def __init__(self) -> None:
        self.connections = 0
        self.failures = 0
        self.answers: dict[str, int] = {}
        self.waits_s: list[float] = []

    def answered(self, response: bytes, waited_s: float) -> None:
        code = response[9:12].decode("ascii", "replace") if response.startswith(b"HTTP/1.1 ") else "none"
        self.answers[code] = self.answers.get(code, 0) + 1
        if code != "none":
            self.waits_s.append(waited_s)

    def summary(self) -> dict[str, object]:
        waits = sorted(self.waits_s)
        return {
            "connections": self.connections,
            "failures": self.failures,
            "answers": self.answers,
            "median_wait_s": round(statistics.median(waits), 4) if waits else None,
            "max_wait_s": round(waits[-1], 4) if waits else None,
        }


async def _connect(host: str, port: int, tally: Tally) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    try:
        pair = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError):
        tally.failures += 1
        await asyncio.sleep(0.05)  # a refused or timed-out connect: do not spin on it
        return None
    tally.connections += 1
    return pair


async def _ask(host: str, port: int, request: bytes, tally: Tally, end: float) -> None:
    """hammer and the /status readers: one whole request, its answer to the end, again."""
    while time.monotonic() < end:
        pair = await _connect(host, port, tally)
        if pair is None:
            continue
        reader, writer = pair
        started = time.monotonic()
        try:
            writer.write(request)
            response = await asyncio.wait_for(reader.read(), ANSWER_TIMEOUT_S)
            tally.answered(response, time.monotonic() - started)
        except (OSError, asyncio.TimeoutError):
            tally.failures += 1
        finally:
            writer.close()


async def _trickle(host: str, port: int, first: bytes, tally: Tally, end: float) -> None:
    """loris (`first` is a request line, then a byte a second) and idle (nothing at all): held until dropped."""
    while time.monotonic() < end:
        pair = await _connect(host, port, tally)
        if pair is None:
            continue
        reader, writer = pair
        try:
            if first:
                writer.write(first)
            while time.monotonic() < end:
                try:
                    data = await asyncio.wait_for(reader.read(4096), 1.0)
                except asyncio.TimeoutError:
                    if first:
                        writer.write(b"X")  # one more byte of a header that never ends
                    continue
                if not data:
                    break  # dropped: connect again
        except OSError:
            pass  # reset: connect again
        finally:
            writer.close()


async def flood(host: str, port: int, kind: str, connections: int, seconds: float, readers: int) -> tuple[Tally, Tally]:
    """The flood's tally and the /status readers'."""
    tally, status = Tally(), Tally()
    end = time.monotonic() + seconds
    if kind == "hammer":
        attackers = [_ask(host, port, REQUEST, tally, end) for _ in range(connections)]
    elif kind in ("loris", "idle"):
        first = b"GET /healthz HTTP/1.1\r\n" if kind == "loris" else b""
        attackers = [_trickle(host, port, first, tally, end) for _ in range(connections)]
    else:
        raise SystemExit(f"unknown kind {kind!r}: hammer, loris or idle")
    await asyncio.gather(*attackers, *(_ask(host, port, STATUS, status, end) for _ in range(readers)))
    return tally, status


def main(argv: list[str]) -> None:
    host, port, kind, connections, seconds = argv[0], int(argv[1]), argv[2], int(argv[3]), float(argv[4])
    readers = int(argv[5]) if len(argv) > 5 else 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 2 * (connections + readers) + 64))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    tally, status = asyncio.run(flood(host, port, kind, connections, seconds, readers))
    print(json.dumps({"kind": kind, "flood": tally.summary(), "status_readers": status.summary()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
