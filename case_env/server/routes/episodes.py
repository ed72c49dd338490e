"""GET /v1/episodes/{id}: the calls of one episode, for audit and trajectory recording."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Request

from case_env.core.tools import ErrorCode
from case_env.server.auth import require_token
from case_env.server.errors import BAD_BODY, UNAUTHORIZED, error_response
from case_env.server.models import EPISODE_ID_PATTERN, EpisodeResponse, ErrorResponse

router = APIRouter(
    prefix="/v1", tags=["episodes"], dependencies=[Depends(require_token)], responses=UNAUTHORIZED
)


@router.get(
    "/episodes/{episode_id}",
    response_model=EpisodeResponse,
    responses={
        404: {"model": ErrorResponse, "description": "Unknown or expired episode."},
        422: BAD_BODY[422],
    },
    summary="The calls of an episode",
)
async def get_episode(
    request: Request, episode_id: str = Path(pattern=EPISODE_ID_PATTERN, description="The episode id.")
):
    found = request.app.state.server.episodes.get(episode_id)
    if found is None:
        return error_response(ErrorCode.INVALID_REQUEST, "unknown or expired episode", status=404)
    return EpisodeResponse.model_validate(found)
