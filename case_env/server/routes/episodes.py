"""GET /v1/episodes/{id}: the calls of one episode, for audit and trajectory recording."""

from __future__ import annotations

from fastapi import APIRouter, Path, Request

from case_env.core.tools import ErrorCode
from case_env.server.errors import BAD_BODY, UNAUTHORIZED, error_response
from case_env.server.models import EPISODE_ID_PATTERN, EpisodeResponse, ErrorResponse
from case_env.server.store import StoreUnavailableError

router = APIRouter(prefix="/v1", tags=["episodes"], responses=UNAUTHORIZED)


@router.get(
    "/episodes/{episode_id}",
    response_model=EpisodeResponse,
    responses={
        404: {"model": ErrorResponse, "description": "Unknown or expired episode."},
        503: {"model": ErrorResponse, "description": "The episode store cannot be reached."},
        422: BAD_BODY[422],
    },
    summary="The calls of an episode",
)
async def get_episode(
    request: Request, episode_id: str = Path(pattern=EPISODE_ID_PATTERN, description="The episode id.")
):
    state = request.app.state.server
    try:
        found = await state.store.get(episode_id)
    except StoreUnavailableError:
        message = "the episode store is unreachable; retry shortly"
        headers = {"Retry-After": str(state.settings.retry_after_s)}
        return error_response(ErrorCode.NOT_READY, message, status=503, headers=headers)
    if found is None:
        return error_response(ErrorCode.INVALID_REQUEST, "unknown or expired episode", status=404)
    return EpisodeResponse(
        episode_id=episode_id,
        patient_id=found.binding.case_id,
        env=found.binding.env,
        created=found.created,
        last_seen=found.last_seen,
        calls_total=found.calls_total,
        calls=found.calls,
        ended=found.binding.ended,
        reward=found.reward,
    )
