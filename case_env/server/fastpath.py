"""The fast path: a well-formed, authorised POST to a hot route answered in front of FastAPI's middleware,
routing and dependency solving, which cost more CPU per cheap call than the call itself.

Two kinds of route have one: `POST /v1/tools/{name}` (answered with the route's own function,
`routes.tools.answer`, so the bytes are the route's) and the exact paths a door registers with `front`
(the MCP door's `tools/call`). `ToolServer.__call__` (the app's ASGI entry) takes a request here only when
everything the full stack would check holds (a Content-Length within the limit, JSON, the token) and the
route's front accepts the body; anything else goes on to the full stack untouched, body included: refusals
keep one implementation and the routes stay in /openapi.json. Before either, headers are bounded (431) and
two `Authorization` headers refused (400), since readers taking the first and the last would disagree about
who is calling.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from case_env.core.tools import ErrorCode
from case_env.server.auth import presented_bearer
from case_env.server.errors import INTERNAL_MESSAGE, error_response
from case_env.server.limits import read_body, replaying
from case_env.server.models import ToolCallRequest
from case_env.server.routes.tools import answer
from case_env.server.state import ServerState

log = logging.getLogger("case_env.server")

PREFIX = "/v1/tools/"
MAX_NAME = 64
MAX_HEADERS = 64  # a client sends about ten
MAX_HEADER_BYTES = 16 * 1024  # names and values together, as h11 bounds a head
_JSON_TYPES = (b"application/json",)
_INTERNAL = error_response(ErrorCode.INTERNAL, INTERNAL_MESSAGE, status=500).body

Answer = tuple[int, Mapping[str, str] | None, bytes]  # status, extra headers, JSON body
# a route's front: the request's state, scope and body in, its answer out, or None to pass it to the full stack
Front = Callable[[ServerState, Scope, bytes], Awaitable[Answer | None]]


class ToolServer(FastAPI):
    """FastAPI with the fast path (tool calls, and the fronts doors register) in front of its middleware stack."""

    # the lifespan's state, set while the app serves: read here without Starlette's `State` lookup
    serving: ServerState | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fronts: dict[str, Front] = {}

    def front(self, path: str, answer: Front) -> None:
        """Answer POSTs to exactly `path` with `answer` in front of the stack, whenever it returns an answer."""
        self.fronts[path] = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = header_refusal(scope["headers"])
            if refusal is not None:
                if self.serving is not None:  # a refused tool call is still a call: it gets its audit line
                    code = ErrorCode.INVALID_REQUEST.value
                    self.serving.audit.refusal(scope["method"], scope["path"], code, refusal.status_code)
                await refusal(scope, receive, send)
                return
            if scope["method"] == "POST":
                path = scope["path"]
                front = _tool_call if path.startswith(PREFIX) else self.fronts.get(path)
                if front is not None:
                    receive = await self._fast(scope, receive, send, front)
                    if receive is None:
                        return
        await super().__call__(scope, receive, send)

    async def _fast(self, scope: Scope, receive: Receive, send: Send, front: Front) -> Receive | None:
        """Answer the request and return None, or return the receive the full stack reads the body from."""
        state = self.serving  # None until the lifespan has opened the cases
        if state is None or state.settings.otel:  # FastAPI's telemetry traces calls in the full stack
            return receive
        kind = length = authorization = None
        for header, value in scope["headers"]:  # uvicorn gives names in lower case
            if header == b"content-type" and kind is None:  # the first, as Starlette's headers read it
                kind = value
            elif header == b"content-length":
                length = value
            elif header == b"authorization":
                authorization = value
        if not _json(kind) or not _authorised(authorization, state):
            return receive
        limit = state.settings.max_body_bytes
        if length is None or not length.isdigit() or int(length) > limit:
            return receive  # chunked or too large: the body limit decides
        # uvicorn delivers no more than the Content-Length, so the limit cannot be passed here
        body = await read_body(receive, limit)
        if body is None:
            return None  # the client went away before sending its body
        try:
            answered = await front(state, scope, body)
            if answered is None:
                return replaying(body, receive)  # the full stack says what is wrong, as it always has
            status, extra, payload = answered
        except Exception:
            log.exception("unhandled error on POST %s", scope["path"])
            status, extra, payload = 500, {}, _INTERNAL
        response = [(b"content-length", b"%d" % len(payload)), (b"content-type", b"application/json")]
        if extra:
            response += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": response})
        await send({"type": "http.response.body", "body": payload})
        return None


async def _tool_call(state: ServerState, scope: Scope, body: bytes) -> Answer | None:
    name = scope["path"][len(PREFIX) :]
    if not _plain_name(name):
        return None
    try:
        call = ToolCallRequest.model_validate_json(body)
    except ValidationError:
        return None  # FastAPI says what is wrong
    return await answer(state, name, call)


def header_refusal(headers: list[tuple[bytes, bytes]]):
    """The response refusing a request whose headers are too many, too large, or name two callers; None
    for any other."""
    size = callers = 0
    for name, value in headers:
        size += len(name) + len(value)
        callers += name == b"authorization"
    if len(headers) > MAX_HEADERS or size > MAX_HEADER_BYTES:
        message = (
            f"request headers too large: at most {MAX_HEADERS} headers and {MAX_HEADER_BYTES} bytes are read"
        )
        return error_response(ErrorCode.INVALID_REQUEST, message, status=431)
    if callers > 1:
        message = "more than one Authorization header: send the bearer token once"
        return error_response(ErrorCode.INVALID_REQUEST, message, status=400)
    return None


def _plain_name(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME and "/" not in name


def _json(kind: bytes | None) -> bool:
    if kind in _JSON_TYPES:  # as every client sends it: no parameters, lower case
        return True
    return kind is not None and kind.split(b";", 1)[0].strip().lower() in _JSON_TYPES


def _authorised(authorization: bytes | None, state) -> bool:
    token = state.settings.token
    return token is None or presented_bearer(authorization, token.get_secret_value())
