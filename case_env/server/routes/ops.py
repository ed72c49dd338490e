"""Liveness, readiness and metrics for orchestrators and Prometheus."""

from __future__ import annotations

import contextlib
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from case_env import __version__
from case_env.server.errors import UNAUTHORIZED
from case_env.server.models import HealthResponse, ReadyResponse
from case_env.server.store import StoreUnavailableError

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=HealthResponse, summary="Liveness: the process answers")
async def healthz() -> HealthResponse:
    return HealthResponse(version=__version__)


@router.get(
    "/readyz",
    response_model=ReadyResponse,
    responses={503: {"model": ReadyResponse, "description": "Not ready."}, **UNAUTHORIZED},
    summary="Readiness: the data root holds cases and the episode store answers",
)
async def readyz(request: Request):
    state = request.app.state.server
    ready, reason = state.readiness()
    live = None
    try:
        await state.store.ping()
        live = await state.store.live(time.time())
    except StoreUnavailableError as exc:
        ready, reason = False, reason or str(exc)
    settings = state.settings
    body = ReadyResponse(
        ready=ready,
        patients=len(state.case_ids()),
        reason=reason,
        store=state.store.name,
        episodes_live=live,
        max_episodes=settings.max_episodes,
        episode_idle_s=settings.episode_idle_s,
    )
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get(
    "/metrics",
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
    with contextlib.suppress(StoreUnavailableError):  # the metrics answer while the store is down
        state.metrics.episodes_live.set(await state.store.live(time.time()))
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
