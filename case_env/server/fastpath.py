"""The fast path of `POST /v1/tools/{name}`: a well-formed, authorised tool call answered without FastAPI's
routing, dependency solving and request objects, which cost more CPU per cheap call than the call itself
(docs/architecture.md, "The path of one tool call").

It is an ASGI middleware inside the body limit. It takes a request only when everything FastAPI would
check holds: the path names a tool (64 characters at most), the method is POST, the body is JSON that
validates as `ToolCallRequest`, and the bearer token matches when one is set. Then it answers with the same
function as the route (`routes.tools.answer`: admission, scope, cache, deadline, metrics, audit, episode),
so the answer is byte for byte the route's. Anything else (a bad token, a malformed body, another route)
goes on to FastAPI untouched, which answers as it always has: refusals keep one implementation, and the
route stays in /openapi.json as the documented contract.
"""

from __future__ import annotations

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from case_env.server.auth import presented_matches
from case_env.server.limits import replaying
from case_env.server.models import ToolCallRequest
from case_env.server.routes.tools import answer

PREFIX = "/v1/tools/"
MAX_NAME = 64
_JSON_TYPES = (b"application/json",)


class ToolCallFastPath:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or not path.startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        name = path[len(PREFIX) :]
        headers = dict(scope["headers"])
        state = scope["app"].state.server
        if not _plain_name(name) or not _json(headers) or not _authorised(headers, state):
            await self.app(scope, receive, send)
            return
        body, receive = await _read(receive)
        try:
            call = ToolCallRequest.model_validate_json(body)
        except ValidationError:
            await self.app(scope, receive, send)  # FastAPI says what is wrong, as it always has
            return
        status, extra, payload = await answer(state, name, call)
        response = [(b"content-length", str(len(payload)).encode()), (b"content-type", b"application/json")]
        response += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": response})
        await send({"type": "http.response.body", "body": payload})


def _plain_name(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME and "/" not in name


def _json(headers: dict[bytes, bytes]) -> bool:
    kind = headers.get(b"content-type")
    return kind is not None and kind.split(b";", 1)[0].strip().lower() in _JSON_TYPES


def _authorised(headers: dict[bytes, bytes], state) -> bool:
    token = state.settings.token
    if token is None:
        return True
    scheme, _, presented = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return presented_matches(presented, token.get_secret_value())


async def _read(receive: Receive) -> tuple[bytes, Receive]:
    """The whole body (the body limit outside has bounded it), and a receive that hands it on again."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"", receive
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    return body, replaying(body, receive)
