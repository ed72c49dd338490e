"""The clinic reward: a pure function of (trajectory text, ground truth, extra_info), components apart.

    score = w_dx · diagnosis − w_cost · cost + w_exam · exam appropriateness

- **diagnosis**: Jaccard of predicted and ground-truth conditions (`case_env.medicine.diagnosis`), from the
  last `<answer>…</answer>` (or MedExAgent's `[DIAGNOSIS: …]`) after the last tool response. More than five
  conditions score nothing. `acc` is strict accuracy (every ground-truth condition named), `acc_lenient`
  at least one.
- **exam appropriateness**: how well the exams ordered cover the recorded work-up: an exact exam counts 1,
  the right exam with other parameters 0.5 (credit only, never findings), over the union of both lists.
- **cost**: every exam ordered is charged (cost + discomfort) / 6, from 1/3 to 1; an exam of the recorded
  work-up is discounted (by 75 % by default) the first time only, so the right exam is cheaper but never
  free, and repeats and wrong-parameter variants pay in full. MedExAgent charged only exams outside the
  work-up and let a right name with wrong arguments through free (docs/sources.md, MedExAgent).

The exams are the episode's executed `order_exam` calls (`case_env.core.calls`: as they ran, from verl's
`tool_extra_fields`, else read from the model's own tool calls in the transcript, hermes or qwen3_coder), so
a tool output cannot order or hide exams. The
recorded work-up comes from the bank row (`extra_info.clinic.exams`). Weights default to MedExAgent's RL
config (1.0, 0.5, 0.1) and can be fixed per bank in `extra_info.clinic.reward`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from case_env.core.answers import ANSWER_TAG, final_segment, last_answer
from case_env.core.calls import ExecutedCall, executed_calls
from case_env.core.llm import ChatClient, default_judge
from case_env.envs.clinic.cases import exam_of
from case_env.medicine.diagnosis import MAX_CONDITIONS, Verdict, conditions, judge
from case_env.medicine.exams import ExamCall, ExamError, parse_exam_string

_DIAGNOSIS_TAG = re.compile(r"\[DIAGNOSIS:\s*(.+?)\]", re.DOTALL)
KEYS = (
    "score",
    "acc",
    "acc_lenient",
    "dx",
    "exam_score",
    "cost",
    "exams",
    "exams_necessary",
    "asks",
    "pred",
    "format_ok",
    "judge",
)


class RewardWeights(BaseModel):
    model_config = ConfigDict(extra="ignore")

    dx: float = Field(1.0, description="Weight of the diagnosis Jaccard.")
    exam: float = Field(0.5, description="Weight of exam appropriateness.")
    cost: float = Field(0.1, description="Weight of the cost penalty.")
    necessary_discount: float = Field(
        0.75, ge=0, le=1, description="Share of a recorded work-up exam's charge waived, first order only."
    )


def ordered_exams(calls: list[ExecutedCall]) -> list[ExamCall]:
    """The exams performed: valid `order_exam` calls (an invalid one was refused, so it did not happen)."""
    exams = []
    for call in calls:
        if call.tool != "order_exam" or not call.ok:
            continue
        arguments = call.arguments
        try:
            exams.append(exam_of({k: v for k, v in arguments.items() if isinstance(v, str)}))
        except ExamError:
            continue
    return exams


def appropriateness(ordered: list[ExamCall], necessary: list[ExamCall]) -> float:
    if not ordered and not necessary:
        return 1.0
    pool = Counter(ordered)
    credit = 0.0
    for exam in necessary:
        if pool[exam] > 0:
            pool[exam] -= 1
            credit += 1.0
            continue
        variant = next((e for e in pool if pool[e] > 0 and e.name == exam.name), None)
        if variant is not None:
            pool[variant] -= 1
            credit += 0.5
    union = len(set(ordered)) + len(necessary) - credit
    return round(credit / union, 6) if union > 0 else 0.0


def cost_penalty(ordered: list[ExamCall], necessary: list[ExamCall], discount: float) -> float:
    remaining = Counter(necessary)
    total = 0.0
    for exam in ordered:
        charge = exam.exam.charge / 6
        if remaining[exam] > 0:
            remaining[exam] -= 1
            charge *= 1 - discount
        total += charge
    return round(total, 6)


def predicted_conditions(solution_str: str) -> tuple[list[str] | None, bool]:
    """The diagnosis named after the last tool response, and whether it was well formed."""
    content = last_answer(final_segment(solution_str or ""), (ANSWER_TAG, _DIAGNOSIS_TAG))
    if content is None:
        return None, False
    named = conditions(content)
    return (named, True) if 0 < len(named) <= MAX_CONDITIONS else (None, False)


def clinic_score(
    solution_str: str, ground_truth: str, extra_info: dict | None = None, client: ChatClient | None = None
) -> dict[str, Any]:
    extra = extra_info if isinstance(extra_info, dict) else {}
    clinic = extra.get("clinic") or {}
    if isinstance(clinic, str):
        clinic = json.loads(clinic)
    weights = RewardWeights.model_validate(clinic.get("reward") or {})
    necessary = []
    for key in clinic.get("exams") or []:
        try:
            necessary.append(parse_exam_string(key))
        except ExamError:
            continue
    truth = conditions(str(ground_truth or ""))
    predicted, well_formed = predicted_conditions(solution_str)
    if predicted is None:
        verdict = Verdict(len(truth), 0, 0, "none")
    else:
        verdict = judge(predicted, truth, client if client is not None else default_judge())
    calls = executed_calls(solution_str, extra)
    ordered = ordered_exams(calls)
    exam_score = appropriateness(ordered, necessary)
    cost = cost_penalty(ordered, necessary, weights.necessary_discount)
    dx = round(verdict.jaccard, 6)
    score = weights.dx * dx + weights.exam * exam_score - weights.cost * cost
    asks = sum(1 for call in calls if call.tool == "ask_patient" and call.ok)
    return {
        "score": round(score, 6),
        "acc": float(verdict.strict),
        "acc_lenient": float(verdict.lenient),
        "dx": dx,
        "exam_score": exam_score,
        "cost": cost,
        "exams": len(ordered),
        "exams_necessary": len(necessary),
        "asks": asks,
        "pred": "; ".join(predicted or []),
        "format_ok": well_formed,
        "judge": verdict.judge,
    }
