"""GET /v1/rows/{env}: the served banks' rows a door can start an episode from, for clients that list their
tasks before they run them (verifiers' tasksets). Keys, prompts and tools: never the ground truth."""

from __future__ import annotations

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from case_env.core.tools import ErrorCode
from case_env.server.doors.episodes import DoorError, row_tools
from case_env.server.errors import BAD_BODY, UNAUTHORIZED, error_response
from case_env.server.models import ErrorResponse

router = APIRouter(prefix="/v1", tags=["doors"], responses=UNAUTHORIZED)


class Row(BaseModel):
    row: str = Field(description="The row's key, which OpenEnv's reset and MCP's start_episode take.")
    prompt: list[dict] = Field(description="The row's chat messages.")
    tools: list[str] = Field(description="The tools the row's persona may call.")


class RowsResponse(BaseModel):
    split: str
    total: int = Field(description="Rows in the split.")
    rows: list[Row]


@router.get(
    "/rows/{env}",
    response_model=RowsResponse,
    responses={404: {"model": ErrorResponse, "description": "No bank or no such split served."}} | BAD_BODY,
    summary="Rows of the served banks, without their answers",
)
async def list_rows(
    request: Request,
    env: str = Path(max_length=64, description="A hosted environment."),
    split: str | None = Query(None, max_length=64, description="A split (default test, else the first)."),
    offset: int = Query(0, ge=0, description="The first row's position in the split."),
    limit: int = Query(100, ge=1, le=1000, description="At most this many rows."),
):
    rows = request.app.state.door_rows
    try:
        split, chosen = rows.split(env, split)
    except DoorError as exc:
        return error_response(ErrorCode.INVALID_REQUEST, str(exc), status=404)
    listed = [
        Row(row=item.key, prompt=[dict(m) for m in item.prompt], tools=row_tools(rows.hosted[env], item))
        for item in chosen[offset : offset + limit]
    ]
    return RowsResponse(split=split, total=len(chosen), rows=listed)
