"""Bearer-token check for every route but /healthz (constant-time comparison).

`TokenGate`, an ASGI middleware, is the one place that refuses: in front of everything else, so a caller
without the token learns nothing about a route: not whether its body is well formed (422), too large (413)
or its path redirected (an outside audit found a malformed body answered 422 before 401). /openapi.json names
the scheme on every route it guards (`contract.py`).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from case_env.core.tools import ErrorCode


def presented_matches(presented: str, token: str) -> bool:
    """The token a client presented (surrounding space ignored) against the server's."""
    # compare_digest on equal-type inputs takes time independent of where they differ.
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def presented_bearer(authorization: bytes | None, token: str) -> bool:
    """An `Authorization` header's bearer token against the server's."""
    scheme, _, presented = (authorization or b"").decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and presented_matches(presented, token)


OPEN = "/healthz"  # the one path a server with a token answers without it (a liveness probe)


def guarded(path: str) -> bool:
    """The paths that take the token, when one is set: all but the liveness probe. Readiness (which counts
    cases), the OpenAPI document and its pages say too much about an exposed server to answer anyone."""
    return path != OPEN


_UNAUTHORIZED = json.dumps(
    {"ok": False, "error": {"code": "unauthorized", "message": "missing or invalid bearer token"}}
).encode()


_TWICE = json.dumps(
    {
        "ok": False,
        "error": {
            "code": "invalid_request",
            "message": "more than one Authorization header: send the bearer token once",
        },
    }
).encode()


class TokenGate:
    """401 for a guarded path without the token, before the body is read or the route looked up; 400 for
    two `Authorization` headers on any path, since readers taking the first and the last would disagree
    about who is calling."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            presented = [v for k, v in scope["headers"] if k == b"authorization"]
            state = scope["app"].state.server
            if len(presented) > 1:
                state.audit.refusal(scope["method"], scope["path"], ErrorCode.INVALID_REQUEST.value, 400)
                headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(_TWICE))]
                await send({"type": "http.response.start", "status": 400, "headers": headers})
                await send({"type": "http.response.body", "body": _TWICE})
                return
            token = state.settings.token
            authorization = presented[0] if presented else None
            if (
                guarded(scope["path"])
                and token is not None
                and not presented_bearer(authorization, token.get_secret_value())
            ):
                state.audit.refusal(scope["method"], scope["path"], ErrorCode.UNAUTHORIZED.value, 401)
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(_UNAUTHORIZED)),
                    (b"www-authenticate", b"Bearer"),
                ]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": _UNAUTHORIZED})
                return
        elif scope["type"] == "websocket":  # OpenEnv's sessions: refused before the handshake is accepted
            token = scope["app"].state.server.settings.token
            authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if token is not None and not presented_bearer(authorization, token.get_secret_value()):
                scope["app"].state.server.audit.refusal(
                    "WEBSOCKET", scope["path"], ErrorCode.UNAUTHORIZED.value, 403
                )
                await send(
                    {"type": "websocket.close", "code": 1008, "reason": "missing or invalid bearer token"}
                )
                return
        await self.app(scope, receive, send)
