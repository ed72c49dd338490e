"""The fast path of `POST /v1/tools/{name}`: a well-formed, authorised tool call answered in front of
FastAPI's middleware, routing and dependency solving, which cost more CPU per cheap call than the call itself.

`ToolServer.__call__` (the app's ASGI entry) takes a request here only when everything the full stack would
check holds (a tool's path, a Content-Length within the limit, JSON, the token, a valid `ToolCallRequest`),
and answers with the route's own function (`routes.tools.answer`), so the bytes are the route's. Anything
else goes on to the full stack untouched, body included: refusals keep one implementation and the route
stays in /openapi.json. Before either, headers are bounded (431) and two `Authorization` headers refused
(400), since readers taking the first and the last would disagree about who is calling.
"""

from __future__ import annotations

import logging

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


class ToolServer(FastAPI):
    """FastAPI with the tool-call fast path in front of its middleware stack."""

    # the lifespan's state, set while the app serves: read here without Starlette's `State` lookup
    serving: ServerState | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = header_refusal(scope["headers"])
            if refusal is not None:
                if self.serving is not None:  # a refused tool call is still a call: it gets its audit line
                    code = ErrorCode.INVALID_REQUEST.value
                    self.serving.audit.refusal(scope["method"], scope["path"], code, refusal.status_code)
                await refusal(scope, receive, send)
                return
            if scope["method"] == "POST" and scope["path"].startswith(PREFIX):
                receive = await self._fast(scope, receive, send)
                if receive is None:
                    return
        await super().__call__(scope, receive, send)

    async def _fast(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """Answer the call and return None, or return the receive the full stack reads the body from."""
        name = scope["path"][len(PREFIX) :]
        state = self.serving  # None until the lifespan has opened the cases
        if state is None or state.settings.otel:  # FastAPI's telemetry traces calls in the full stack
            return receive
        kind = length = authorization = None
        for header, value in scope["headers"]:  # uvicorn gives names in lower case
            if header == b"content-type":
                kind = value
            elif header == b"content-length":
                length = value
            elif header == b"authorization":
                authorization = value
        if not _plain_name(name) or not _json(kind) or not _authorised(authorization, state):
            return receive
        limit = state.settings.max_body_bytes
        if length is None or not length.isdigit() or int(length) > limit:
            return receive  # chunked or too large: the body limit decides
        # uvicorn delivers no more than the Content-Length, so the limit cannot be passed here
        body = await read_body(receive, limit)
        if body is None:
            return None  # the client went away before sending its body
        try:
            call = ToolCallRequest.model_validate_json(body)
        except ValidationError:
            return replaying(body, receive)  # FastAPI says what is wrong, as it always has
        try:
            status, extra, payload = await answer(state, name, call)
        except Exception:
            log.exception("unhandled error on POST %s", scope["path"])
            status, extra, payload = 500, {}, _INTERNAL
        response = [(b"content-length", b"%d" % len(payload)), (b"content-type", b"application/json")]
        if extra:
            response += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": response})
        await send({"type": "http.response.body", "body": payload})
        return None


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
