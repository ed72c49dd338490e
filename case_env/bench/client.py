"""A lean HTTP/1.1 client for load generators: one keep-alive connection per virtual client, one request
at a time, JSON in and raw bytes out.

A closed-loop benchmark on a small machine shares its cores with the server it measures, so whatever the
load generator spends per call is taken from the server. aiohttp's client cost about 0.23 ms of CPU per
call here (cheap mix, 3,900 calls/s took 0.87 of the two cores); this one writes a request as one
preformatted buffer and parses only the status line, Content-Length or chunked framing and `Connection`,
a fraction of that (measured with py-spy). A closed loop never pipelines, so a
connection holds at most one request in flight; `wrk` and `h2load` are built the same way.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.1 this client can frame."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is not None and not self.waiter.done():
            try:
                answer = _frame(self.buffer)
            except ProtocolError as exc:
                self.waiter.set_exception(exc)
                return
            if answer is not None:
                self.waiter.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("the server closed the connection")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)


def _frame(buffer: bytearray) -> tuple[int, bytes, bool] | None:
    """(status, body, keep-alive) of the complete response at the start of `buffer`, removed from it; None
    while more bytes are needed."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(buffer[:end]).split(b"\r\n")
    if not lines[0].startswith(b"HTTP/1.") or len(lines[0]) < 12:
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(lines[0][9:12])
    length = None
    chunked = False
    keep_alive = lines[0].startswith(b"HTTP/1.1")
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            keep_alive = value.strip().lower() == b"keep-alive"
    start = end + 4
    if chunked:
        body = _dechunk(buffer, start)
        if body is None:
            return None
        body, stop = body
    elif length is not None:
        stop = start + length
        if len(buffer) < stop:
            return None
        body = bytes(buffer[start:stop])
    else:
        raise ProtocolError("a response with neither Content-Length nor chunked framing")
    del buffer[:stop]
    return status, body, keep_alive


def _dechunk(buffer: bytearray, at: int) -> tuple[bytes, int] | None:
    parts = []
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(bytes(buffer[at:line_end]).split(b";", 1)[0], 16)
        at = line_end + 2
        if size == 0:  # no trailers from the servers measured: the last chunk ends with an empty line
            if len(buffer) < at + 2:
                return None
            return b"".join(parts), at + 2
        if len(buffer) < at + size + 2:
            return None
        parts.append(bytes(buffer[at : at + size]))
        at += size + 2


class Client:
    """One virtual client's connection to `url` (http only), opened on first use and again after the server
    closes it."""

    def __init__(self, url: str, timeout_s: float = 60.0):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the load generator speaks plain http to a host: {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s = timeout_s
        self._head = f"Host: {parts.netloc}\r\nContent-Type: application/json\r\nContent-Length: "
        self._connection: _Connection | None = None

    async def post_json(self, path: str, document: object, headers: str = "") -> tuple[int, bytes]:
        """(status, body) of `POST path` with `document` as JSON (`headers`: more header lines, each ending in
        CRLF); OSError, TimeoutError or ProtocolError when the exchange fails (the connection is then dropped)."""
        body = json.dumps(document, separators=(",", ":")).encode()
        request = f"POST {path} HTTP/1.1\r\n{headers}{self._head}{len(body)}\r\n\r\n".encode() + body
        loop = asyncio.get_running_loop()
        connection = self._connection
        if connection is None or connection.lost is not None:
            _, connection = await loop.create_connection(_Connection, self.host, self.port)
            self._connection = connection
        connection.waiter = waiter = loop.create_future()
        timer = loop.call_later(self.timeout_s, _expire, waiter)
        connection.transport.write(request)
        try:
            status, answer, keep_alive = await waiter
        except BaseException:
            self.close()
            raise
        finally:
            timer.cancel()
            connection.waiter = None
        if not keep_alive:
            self.close()
        return status, answer

    def close(self) -> None:
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()
        self._connection = None


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no complete answer within the timeout"))
