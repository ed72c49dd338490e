"""uvicorn's httptools protocol, writing each response in one system call, and cutting slow clients.

uvicorn writes a response's head and body in two `send` calls; on loopback each wakes the waiting client at
the writer's cost. Here the transport holds what is written and hands a complete response to the socket as
one `writelines` (one `writev`, no copy); anything written short of a complete response goes out at the end
of the loop's turn. Bytes and order are unchanged.

uvicorn also lets a client hold a connection as long as it likes before or inside a request. Here a
request's head must arrive within `CASE_ENV_HEAD_TIMEOUT_S` (10 s) of opening or of the last response, its
body within `CASE_ENV_BODY_TIMEOUT_S` (30 s) of the head; past either the client gets `408` and is closed.
`case-env serve` and the bench's case-env engines pass this class to uvicorn as its `http` protocol.
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
