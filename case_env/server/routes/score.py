"""POST /v1/score: the reward function over HTTP, identical to what verl and eval call."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from case_env.reward import compute_score
from case_env.server.auth import require_token
from case_env.server.errors import BAD_BODY, UNAUTHORIZED

router = APIRouter(
    prefix="/v1", tags=["reward"], dependencies=[Depends(require_token)], responses=UNAUTHORIZED | BAD_BODY
)


class ScoreRequest(BaseModel):
    data_source: str = Field(max_length=128, description="The row's data_source.")
    solution_str: str = Field(
        max_length=200_000, description="The whole decoded response, tool turns included."
    )
    ground_truth: str = Field(max_length=64, description="The row's reward_model.ground_truth (a letter).")
    extra_info: dict[str, Any] | None = Field(None, description="The row's extra_info (not needed to score).")


class ScoreResponse(BaseModel):
    score: float = Field(description="1.0 when the final answer's letter matches the ground truth, else 0.0.")
    acc: float = Field(description="Same as score, for verl's logging.")
    pred: str = Field(description="The letter read from the final answer ('' when none).")
    format_ok: bool = Field(description="A single well-formed answer is the last thing written.")


@router.post("/score", response_model=ScoreResponse, summary="Score a completion with the reward function")
async def score(body: ScoreRequest) -> ScoreResponse:
    return ScoreResponse(
        **compute_score(body.data_source, body.solution_str, body.ground_truth, body.extra_info)
    )
