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
    ground_truth: str = Field(
        max_length=1000, description="The row's reward_model.ground_truth: a letter, or a clinic diagnosis."
    )
    extra_info: dict[str, Any] | None = Field(
        None, description="The row's extra_info; clinic rows need its `clinic` entry (the recorded work-up)."
    )


class ClinicComponents(BaseModel):
    acc_lenient: float = Field(description="1.0 when at least one ground-truth condition is named.")
    dx: float = Field(description="Jaccard of predicted and ground-truth conditions.")
    exam_score: float = Field(description="Exam appropriateness against the recorded work-up, 0-1.")
    cost: float = Field(
        description="Cost penalty: sum over exams ordered of (cost + discomfort) / 6, discounted."
    )
    exams: int = Field(description="Exams ordered (valid order_exam calls).")
    exams_necessary: int = Field(description="Exams of the recorded work-up.")
    asks: int = Field(description="Questions put to the patient.")
    judge: str = Field(description="Who decided the diagnosis match: rules, judge, refused, rejected, ...")


class ScoreResponse(BaseModel):
    score: float = Field(
        description="Imaging: 1.0 when the final answer's letter matches the ground truth, else 0.0. Clinic: "
        "w_dx * dx + w_exam * exam_score - w_cost * cost."
    )
    acc: float = Field(description="Imaging: same as score. Clinic: strict accuracy (every condition named).")
    pred: str = Field(description="The answer read from the final message ('' when none).")
    format_ok: bool = Field(description="A single well-formed answer is the last thing written.")
    clinic: ClinicComponents | None = Field(
        None, description="The clinic reward's components (clinic_* only)."
    )


@router.post(
    "/score",
    response_model=ScoreResponse,
    response_model_exclude_none=True,
    summary="Score a completion with the reward function",
)
def score(body: ScoreRequest) -> ScoreResponse:  # sync: FastAPI runs it in its thread pool, so a judge's
    # HTTP round trip never blocks the event loop
    result = compute_score(body.data_source, body.solution_str, body.ground_truth, body.extra_info)
    common = {key: result.pop(key) for key in ("score", "acc", "pred", "format_ok")}
    return ScoreResponse(**common, clinic=ClinicComponents(**result) if result else None)
