"""Bearer-token check for /v1 routes and /metrics (constant-time comparison).

Declared through FastAPI's `HTTPBearer`, so /openapi.json names the scheme on every route that needs it and
clients and fuzzers can see which routes take a token.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from case_env.core.tools import ErrorCode

bearer = HTTPBearer(auto_error=False, description="The server's token (CASE_ENV_TOKEN), when one is set.")


class AuthError(Exception):
    """Raised by the dependency; the app turns it into 401 with a WWW-Authenticate header."""


def token_matches(credentials: HTTPAuthorizationCredentials | None, token: str) -> bool:
    return presented_matches(credentials.credentials if credentials is not None else "", token)


def presented_matches(presented: str, token: str) -> bool:
    """The token a client presented (surrounding space ignored) against the server's."""
    # compare_digest on equal-type inputs takes time independent of where they differ.
    return hmac.compare_digest(presented.strip().encode(), token.encode())


async def require_token(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> None:
    state = request.app.state.server
    token = state.settings.token
    if token is None:
        return
    if not token_matches(credentials, token.get_secret_value()):
        state.audit.refusal(request.method, request.url.path, ErrorCode.UNAUTHORIZED.value, 401)
        raise AuthError
