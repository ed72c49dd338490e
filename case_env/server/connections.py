"""What uvicorn has no setting for: how long a client may take to send a request, and how large its head is.

uvicorn lets a client hold a connection as long as it likes before or inside a request (`timeout_keep_alive`
starts only after a response), and its httptools parser buffers a request head of any size. Both let a
few clients tie up a worker (an outside audit held twelve connections 45 s each, and sent 200 KB heads).
This is the smallest piece that closes both, as a subclass of uvicorn's own protocol, which `case-env
serve` passes as uvicorn's `http` setting: a request's head must arrive within `CASE_ENV_HEAD_TIMEOUT_S`
(10 s) of the connection opening or of its last response, its body within `CASE_ENV_BODY_TIMEOUT_S` (30 s)
of the head, or the client gets `408` and is closed; a head of more than 64 headers or 16 KiB gets `431`.
Everything else is uvicorn's, unchanged.
"""

from __future__ import annotations

import asyncio
import functools

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

PROTOCOL = "case_env.server.connections:BoundedHttpToolsProtocol"  # what uvicorn's `http` setting takes
MAX_HEADERS = 64  # a client sends about ten
MAX_HEADER_BYTES = 16 * 1024  # names and values together, as h11 bounds a head
MAX_HEAD_BYTES = MAX_HEADER_BYTES + 8 * 1024  # the raw head, its request line included, read at most


@functools.cache
def deadlines() -> tuple[float, float]:
    """(head, body) seconds, read once per worker from its settings."""
    from case_env.server.settings import ServerSettings

    settings = ServerSettings()
    return settings.head_timeout_s, settings.body_timeout_s


def _answer(status: bytes, message: bytes) -> bytes:
    body = b'{"ok":false,"error":{"code":"invalid_request","message":"%s"}}' % message
    return (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (status, len(body), body)
    )


_TIMEOUT = _answer(b"408 Request Timeout", b"the request did not arrive in time")
_TOO_LARGE = _answer(
    b"431 Request Header Fields Too Large",
    b"request headers too large: at most %d headers and %d bytes are read" % (MAX_HEADERS, MAX_HEADER_BYTES),
)


class _HeadTooLargeError(Exception):
    """Raised inside the parser's callback, which stops parsing; uvicorn then refuses the request
    (`send_400_response`), with 431 here."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with deadlines for a request's head and body and a bounded head."""

    _deadline: asyncio.TimerHandle | None = None
    _begun = False  # bytes of a request arrived that did not yet make a whole one
    _in_head = True  # the current request's head is not complete yet
    _head_bytes = 0  # raw bytes received while it was not
    _headers = _header_bytes = 0
    _too_large = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(deadlines()[0])

    def data_received(self, data: bytes) -> None:
        self._begun = self._begun or bool(data)
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._too_large = True  # a head still open past the bound
            self.send_400_response("")

    def send_400_response(self, msg: str) -> None:
        if not self._too_large:
            super().send_400_response(msg)
            return
        self._arm(None)
        self.transport.write(_TOO_LARGE)
        self.transport.close()

    def on_message_begin(self) -> None:
        self._headers = self._header_bytes = 0
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        self._header_bytes += len(name) + len(value)
        if self._headers > MAX_HEADERS or self._header_bytes > MAX_HEADER_BYTES:
            self._too_large = True
            raise _HeadTooLargeError
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()
        self._arm(deadlines()[1])

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._begun = False
        self._in_head, self._head_bytes = True, 0
        self._arm(None)  # the app answers within its own deadlines

    def on_response_complete(self) -> None:
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
