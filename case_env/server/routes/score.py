"""POST /v1/score: the reward function over HTTP, identical to what verl and eval call: the row is routed to its
environment (`extra_info.env`, else the environment claiming its data source) and scored by its reward."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from case_env.core.registry import RegistryError
from case_env.core.tools import ErrorCode
from case_env.reward import RowError, capped, environment_of
from case_env.server.auth import require_token
from case_env.server.errors import BAD_BODY, UNAUTHORIZED, error_response, short

router = APIRouter(
    prefix="/v1", tags=["reward"], dependencies=[Depends(require_token)], responses=UNAUTHORIZED | BAD_BODY
)


class ScoreRequest(BaseModel):
    data_source: str = Field(max_length=128, description="The row's data_source.")
    solution_str: str = Field(
        max_length=200_000, description="The whole decoded response, tool turns included."
    )
    ground_truth: str = Field(
        max_length=1000, description="The row's reward_model.ground_truth (a letter, a name, ...)."
    )
    extra_info: dict[str, Any] | None = Field(
        None,
        description="The row's extra_info (its `env` routes it; the environment's reward reads its own entries), "
        "with the episode's executed calls under `case_env_tool_calls` when known.",
    )


class ScoreResponse(BaseModel):
    env: str = Field(description="The environment whose reward scored the row.")
    score: float = Field(description="The reward, as the row's environment computes it.")
    acc: float = Field(description="Accuracy: 1.0 when the answer is right by the environment's rule.")
    pred: str = Field(description="The answer read from the final message ('' when none).")
    format_ok: bool = Field(description="A single well-formed answer is the last thing written.")
    components: dict[str, Any] | None = Field(
        None, description="The environment's own reward components (absent when it has none)."
    )
    reason: str | None = Field(
        None, description="Why the row scored 0 without being read (scoring passed its deadline)."
    )


@router.post(
    "/score",
    response_model=ScoreResponse,
    response_model_exclude_none=True,
    responses={422: BAD_BODY[422]},
    summary="Score a completion with the reward function of its row's environment",
)
async def score(body: ScoreRequest, request: Request) -> Response:
    try:
        env = environment_of(body.data_source, body.extra_info)
    except (RegistryError, RowError) as exc:
        return error_response(ErrorCode.INVALID_REQUEST, short(f"invalid request: {exc}"), status=422)
    # off the event loop (a judge's HTTP round trips), with a deadline: a slow judge or a pathological row
    # costs its own caller a zero, never the server a stall
    deadline = request.app.state.server.settings.score_deadline_s
    work = asyncio.to_thread(env.score, capped(body.solution_str), body.ground_truth, body.extra_info)
    try:
        result = await asyncio.wait_for(work, deadline)
    except TimeoutError:
        reply = ScoreResponse(
            env=env.name,
            score=0.0,
            acc=0.0,
            pred="",
            format_ok=False,
            reason=f"scoring took longer than its deadline of {deadline:g} s (CASE_ENV_SCORE_DEADLINE_S)",
        )
    else:
        reply = ScoreResponse(
            env=env.name,
            score=result.score,
            acc=result.acc,
            pred=result.pred,
            format_ok=result.format_ok,
            components=result.components or None,
        )
    return Response(reply.model_dump_json(exclude_none=True), media_type="application/json")
