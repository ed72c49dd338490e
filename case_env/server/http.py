"""uvicorn's httptools protocol, writing each response in one system call instead of two.

uvicorn writes a response's status line and headers when the app sends `http.response.start`, and its body
when the app sends `http.response.body`: two `send` calls on the socket for every answer. On loopback each
one that finds the client waiting wakes it, and the wake-up is paid by the writer; the write of the
headers alone was 6 % of a render's server CPU (issue 19 profile). Here the connection's transport holds
what is written and hands it to the socket as one `writelines` (one `writev`, no copy) when the response
is complete: a tool answer's head and body go out together. What is written without completing a response
(a `100 Continue`, the chunks of a streamed body) goes out at the end of the current turn of the event
loop. The bytes and their order are unchanged, and closing the connection writes what is held first.

It also cuts slow and idle clients, which uvicorn leaves connected for as long as they like: its keep-alive
timer runs only between a response and the first byte of the next request, so a connection that never sends
a request, sends its head a byte at a time or stops short of its Content-Length held a worker's connection
slot indefinitely (45 s in the issue 31 run, and counting). A connection must deliver a request's head within
`CASE_ENV_HEAD_TIMEOUT_S` (10 s) of opening or of its last response, and its body within
`CASE_ENV_BODY_TIMEOUT_S` (30 s) of the head; past either it gets `408 Request Timeout` (when a request had
begun) and is closed. An idle keep-alive connection is closed by uvicorn after `timeout_keep_alive` (5 s).

`case-env serve` (and `case-env bench server` for the engines that run case-env's app) pass this class to
uvicorn as its `http` protocol.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

PROTOCOL = "case_env.server.http:OneWriteHttpToolsProtocol"  # what uvicorn's `http` setting takes


class _Held:
    """A transport that holds writes until `flush` (or the end of the loop's turn), then sends them at once."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)  # for writes that complete no response
        self._held.append(data)

    def flush(self) -> None:
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.writelines(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def __getattr__(self, name: str) -> Any:  # everything else is the socket's transport
        return getattr(self._transport, name)


@functools.cache
def deadlines() -> tuple[float, float]:
    """(head, body) seconds, read once per worker from its settings."""
    from case_env.server.settings import ServerSettings

    settings = ServerSettings()
    return settings.head_timeout_s, settings.body_timeout_s


_TIMEOUT_BODY = (
    b'{"ok":false,"error":{"code":"invalid_request","message":"the request did not arrive in time"}}'
)
_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a transport that sends a response's writes at once, with deadlines
    for a request's head and body."""

    _deadline: asyncio.TimerHandle | None = None
    _begun = False  # bytes of a request arrived that did not yet make a whole one

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Held(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]
        self._arm(deadlines()[0])

    def data_received(self, data: bytes) -> None:
        self._begun = self._begun or bool(data)
        super().data_received(data)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(deadlines()[1])

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._begun = False
        self._arm(None)  # the app answers within its own deadlines

    def on_response_complete(self) -> None:
        # uvicorn calls this once the last body write of a response is made: it goes out now, not at the end
        # of a turn of the loop that may still hold other calls' work
        self.transport.flush()  # type: ignore[attr-defined]
        super().on_response_complete()
        if not self.pipeline and not self.transport.is_closing():
            self._arm(deadlines()[0])  # the next request's head, however slowly its bytes come

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        super().connection_lost(exc)

    def _arm(self, seconds: float | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None if seconds is None else self.loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._begun:
            self.transport.write(_TIMEOUT)
        self.transport.close()
