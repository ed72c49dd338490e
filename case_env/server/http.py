"""uvicorn's httptools protocol, writing each response in one system call instead of two.

uvicorn writes a response's status line and headers when the app sends `http.response.start`, and its body
when the app sends `http.response.body`: two `send` calls on the socket for every answer. On loopback each
one that finds the client waiting wakes it, and the wake-up is paid by the writer; the write of the
headers alone was 6 % of a render's server CPU (issue 19 profile). Here the connection's transport holds
what is written and hands it to the socket as one `writelines` (one `writev`, no copy) when the response
is complete: a tool answer's head and body go out together. What is written without completing a response
(a `100 Continue`, the chunks of a streamed body) goes out at the end of the current turn of the event
loop. The bytes and their order are unchanged, and closing the connection writes what is held first.

`case-env serve` (and `case-env bench server` for the engines that run case-env's app) pass this class to
uvicorn as its `http` protocol.
"""

from __future__ import annotations

import asyncio
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


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a transport that sends a response's writes at once."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Held(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        # uvicorn calls this once the last body write of a response is made: it goes out now, not at the end
        # of a turn of the loop that may still hold other calls' work
        self.transport.flush()  # type: ignore[attr-defined]
        super().on_response_complete()
