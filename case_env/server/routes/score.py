"""POST /v1/score: the reward function over HTTP, identical to what verl and eval call: the row is routed to its
environment (`extra_info.env`, else the environment claiming its data source) and scored by its reward.

A score request carries a whole trajectory, so its work is bounded before it starts and done off the event
loop: the body limit (`CASE_ENV_MAX_SCORE_BODY_BYTES`), then at most `MAX_SCORED_CALLS` executed calls,
counted on the raw bytes; parsing, validation and scoring run in a thread under the scoring deadline. So no
body a token holder sends stalls the tool calls the same worker serves."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError

from case_env.core.calls import MAX_SCORED_CALLS
from case_env.core.environment import Environment, Score
from case_env.core.problems import describe_errors
from case_env.core.registry import RegistryError
from case_env.core.tools import ErrorCode
from case_env.reward import RowError, Scored, scorer
from case_env.server.errors import BAD_BODY, UNAUTHORIZED, error_response, short

router = APIRouter(prefix="/v1", tags=["reward"], responses=UNAUTHORIZED | BAD_BODY)


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


class RequestError(ValueError):
    """A score request the caller must fix: 422 with this message."""


def _routed(raw: bytes) -> tuple[Environment, Scored]:
    """The request body parsed and validated, its row's environment and its reward as the entry point
    computes it for verl (`scorer`), in a worker thread."""
    try:
        body = ScoreRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestError(describe_errors(exc.errors(include_url=False), ("body",))) from None
    try:
        return scorer(body.data_source, body.solution_str, body.ground_truth, body.extra_info)
    except (RegistryError, RowError) as exc:
        raise RequestError(str(exc)) from None


@router.post(
    "/score",
    response_model=ScoreResponse,
    response_model_exclude_none=True,
    responses={422: BAD_BODY[422]},
    summary="Score a completion with the reward function of its row's environment",
    openapi_extra={
        "requestBody": {
            "required": True,
            # the body is read raw (bounded before parsing); the contract adds ScoreRequest's component
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScoreRequest"}}},
        }
    },
)
async def score(request: Request) -> Response:
    raw = await request.body()  # already read and bounded by the body limit
    if raw.count(b'"tool"') > MAX_SCORED_CALLS:  # an upper bound of the calls, without parsing
        message = f"invalid request: extra_info.case_env_tool_calls holds more than {MAX_SCORED_CALLS} calls"
        return error_response(ErrorCode.INVALID_REQUEST, message, status=422)
    # off the event loop (parsing a large body, reading a long text), with a deadline: a slow judge or a
    # pathological row costs its own caller a zero, never the server a stall
    try:
        env, scored = await asyncio.to_thread(_routed, raw)
    except RequestError as exc:
        return error_response(ErrorCode.INVALID_REQUEST, short(f"invalid request: {exc}"), status=422)
    deadline = request.app.state.server.settings.score_deadline_s
    try:
        result = Score.of(await asyncio.wait_for(asyncio.to_thread(asyncio.run, scored()), deadline))
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
