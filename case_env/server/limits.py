"""Refuse request bodies above a size limit before they are read into memory (413).

Tool calls are small; a score request carries a whole decoded trajectory, so its route has its own, larger
limit. A refused tool call is still a call: it gets its audit line like any other refusal.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from case_env.core.tools import ErrorCode

_BODY = json.dumps(
    {"ok": False, "error": {"code": "invalid_request", "message": "request body too large"}}
).encode()


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, per_path: dict[str, int] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.per_path = per_path or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.per_path.get(scope["path"], self.max_bytes)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _refuse(scope, send)
            return
        # Read the whole body here (it is small by definition) so an oversized stream without Content-Length
        # is refused before the app sees any of it; the app then reads the buffered body.
        try:
            body = await read_body(receive, limit)
        except BodyTooLargeError:
            await _refuse(scope, send)
            return
        if body is None:
            return  # the client went away
        await self.app(scope, replaying(body, receive), send)


class BodyTooLargeError(Exception):
    """The body went past the limit while it was read."""


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None when the client went away first; BodyTooLargeError as soon as more
    than `limit` bytes have arrived."""
    chunks, seen = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        seen += len(chunks[-1])
        if seen > limit:
            raise BodyTooLargeError
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands on a body already read, then waits on the real one (for the disconnect, as the
    server would)."""
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(scope: Scope, send: Send) -> None:
    scope["app"].state.server.audit.refusal(
        scope["method"], scope["path"], ErrorCode.INVALID_REQUEST.value, 413
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_BODY)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _BODY})
