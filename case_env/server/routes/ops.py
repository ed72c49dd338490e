"""Liveness, readiness and metrics for orchestrators and Prometheus."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from case_env import __version__
from case_env.server.auth import require_token
from case_env.server.errors import UNAUTHORIZED
from case_env.server.models import HealthResponse, ReadyResponse

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=HealthResponse, summary="Liveness: the process answers")
async def healthz() -> HealthResponse:
    return HealthResponse(version=__version__)


@router.get(
    "/readyz",
    dependencies=[Depends(require_token)],  # it counts cases: an exposed server answers it to the token only
    response_model=ReadyResponse,
    responses={503: {"model": ReadyResponse, "description": "Not ready."}, **UNAUTHORIZED},
    summary="Readiness: the data root is readable and holds cases",
)
async def readyz(request: Request):
    state = request.app.state.server
    ready, reason = state.readiness()
    body = ReadyResponse(ready=ready, patients=len(state.case_ids()), reason=reason)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get(
    "/metrics",
    dependencies=[Depends(require_token)],
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}, "description": "Prometheus text format."},
        **UNAUTHORIZED,
    },
    summary="Prometheus metrics",
)
async def metrics(request: Request) -> Response:
    state = request.app.state.server
    state.note_gauges()
    state.metrics.episodes_live.set(state.episodes.live())
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
