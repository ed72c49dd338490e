"""How failures become HTTP answers: status per error code, one response shape, no tracebacks."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from case_env.core.tools import ErrorCode
from case_env.server.models import ErrorInfo, ErrorResponse

HTTP_STATUS = {
    ErrorCode.INVALID_REQUEST: 422,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.SCOPE_VIOLATION: 403,
    ErrorCode.UNKNOWN_PATIENT: 404,
    ErrorCode.EPISODE_ENDED: 409,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.NOT_READY: 503,
    ErrorCode.DATA_UNAVAILABLE: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.INTERNAL: 500,
}  # every other code is a model fault: HTTP 200 with ok false


# Answers any route can give before its handler runs, all in the ErrorResponse shape: the bearer check (routes
# that take a token), the body limit and body validation (routes that take a body).
UNAUTHORIZED = {401: {"model": ErrorResponse, "description": "Missing or wrong bearer token."}}
BAD_BODY = {
    413: {"model": ErrorResponse, "description": "Request body too large."},
    422: {"model": ErrorResponse, "description": "Malformed request body or parameters."},
}


INTERNAL_MESSAGE = "internal error; the failure was logged"


def status_of(code: ErrorCode) -> int:
    return HTTP_STATUS.get(code, 200)


def error_response(
    code: ErrorCode, message: str, status: int | None = None, headers: dict | None = None
) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(code=code, message=message)).model_dump(mode="json")
    return JSONResponse(body, status_code=status or status_of(code), headers=headers)


def short(text: str, limit: int = 300) -> str:
    """Bound what is echoed back from client input."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
