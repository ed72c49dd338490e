"""Bearer-token check for /v1 routes and /metrics (constant-time comparison)."""

from __future__ import annotations

import hmac

from fastapi import Request

from case_env.tooling import ErrorCode


class AuthError(Exception):
    """Raised by the dependency; the app turns it into 401 with a WWW-Authenticate header."""


def token_matches(header: str | None, token: str) -> bool:
    scheme, _, value = (header or "").partition(" ")
    # compare_digest on equal-type inputs takes time independent of where they differ.
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


async def require_token(request: Request) -> None:
    state = request.app.state.server
    token = state.settings.token
    if token is None:
        return
    if not token_matches(request.headers.get("authorization"), token.get_secret_value()):
        if request.url.path.startswith("/v1/tools/") and request.method == "POST":
            tool = request.url.path.rsplit("/", 1)[-1]
            state.audit.write(episode_id=None, patient_id=None, tool=tool, arguments=None,
                              status=ErrorCode.UNAUTHORIZED.value, http_status=401, latency_ms=0.0)  # fmt: skip
        raise AuthError
