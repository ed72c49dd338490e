"""The case-reasoning reward: a pure function of (trajectory text, final diagnosis, extra_info).

Which text is the answer (`extra_info.casereason.extraction`, `EXTRACTIONS`):
- `strict`, the training default: the last `<answer>…</answer>` after the last tool response, with nothing
  after it; no answer scores 0. A policy under RL finds every loose end of a rule, and this one leaves none:
  a tool output never answers, a second answer after the first cannot hedge, and a reply without the tag
  earns nothing, so the format is learnt.
- `reference`, the evaluation default: as MedCaseReasoning's harness reads a reply, the first `<answer>` of
  the final reply and, when it has none, the whole reply (its `<think>` blocks left out), so figures are
  comparable with the paper's.
`format_ok` needs a non-empty `<think>` and a tagged answer in either profile. With sequential attempts (`extra_info.casereason.attempts` = k > 1), the diagnoses the
model submitted with `submit_diagnosis` (its executed calls, `case_env.core.calls`, never tool output) are its
attempts in order, followed by the final answer when it differs from the last submission; only the first k
count. `acc` is 1 when one of them is correct; `credit` is 1 − (i − 1) / k for the first correct attempt i (a
right first guess is worth more than a right fifth); `score` is `credit` plus the `recall` weight (0 unless
the row's `reward_weights` sets one) × reasoning recall. Keys: score, acc, pred, format_ok, judge, credit,
recall, attempts, first_correct.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from case_env.core import registry
from case_env.core.answers import ANSWER_TAG, final_segment, last_answer, model_text
from case_env.core.calls import Call, ScoreExtra, decoded, executed_calls
from case_env.core.environment import Component, row_weights, weighted
from case_env.core.llm import Asker, asked_judge, fell_back
from case_env.core.tags import Tagged
from case_env.envs.casereason.judge import judge
from case_env.envs.casereason.recall import reasoning_recall
from case_env.medicine.diagnosis import canonical

_THINK = Tagged("<think>", "</think>", to_end=True)
KEYS = (
    *("score", "acc", "pred", "format_ok", "judge", "judge_fallback"),
    *("credit", "recall", "attempts", "first_correct"),
)
COMPONENTS = (
    Component("credit", 1.0, "the diagnosis: 1 - (i - 1) / k for the first correct attempt i of k, else 0"),
    Component(
        "recall", 0.0, "reasoning recall: the share of the case's clinician statements the trace covers"
    ),
)
EXTRACTIONS = ("strict", "reference")


def extract_answer(text: str, extraction: str = "strict") -> tuple[str | None, bool]:
    """(the answer, whether it was tagged) under one of `EXTRACTIONS`."""
    if extraction not in EXTRACTIONS:
        raise ValueError(f"unknown answer extraction {extraction!r}; choose {' or '.join(EXTRACTIONS)}")
    reply = final_segment(text)
    if extraction == "strict":
        content = last_answer(reply, (ANSWER_TAG,))
        return (content.strip() or None if content else None), bool(content and content.strip())
    first = ANSWER_TAG.search(reply)
    if first is not None:
        return first.group(1).strip() or None, bool(first.group(1).strip())
    return reply.strip() or None, False


class ReasoningRecord(BaseModel):
    """`extra_info.casereason` as the reward reads it (case_env/envs/casereason/bank.py writes it)."""

    model_config = ConfigDict(extra="allow", strict=True)

    mode: Literal["independent", "sequential"] = "independent"
    attempts: int = Field(1, ge=1, le=100)
    statements: list[str] = Field(default_factory=list)
    extraction: Literal["strict", "reference"] = "strict"
    eval_extraction: Literal["strict", "reference"] = "reference"

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        # banks built before the weights moved hold 0 here, the default: only another value is refused
        if isinstance(data, dict) and data.get("recall_weight") not in (None, 0, 0.0):
            raise ValueError(
                "recall_weight is no longer read here: set extra_info.reward_weights.recall instead "
                "(`case-env bank build --reward-weights recall=W`)"
            )
        return data


class ReasoningScoreExtra(ScoreExtra):
    casereason: Annotated[ReasoningRecord | None, BeforeValidator(decoded)] = None


def attempts_of(calls: list[Call], final: str | None) -> list[str]:
    submitted = [
        str(c.arguments.get("diagnosis", "")).strip()
        for c in calls
        if c.tool == "submit_diagnosis" and c.ok and str(c.arguments.get("diagnosis", "")).strip()
    ]
    if final and (not submitted or canonical(final) != canonical(submitted[-1])):
        submitted.append(final)
    return submitted


async def first_correct(attempts: list[str], truth: str, client: Asker | None) -> tuple[int, str]:
    """The first attempt judged correct (1-based, 0 for none), and who decided the last verdict."""
    how = "none"
    for i, attempt in enumerate(attempts, start=1):
        verdict = await judge(attempt, truth, client)
        how = verdict.by
        if verdict.correct:
            return i, how
    return 0, how


async def casereason_score(
    solution_str: str,
    ground_truth: str,
    extra_info: ScoreExtra | Mapping | None = None,
    client: Asker | None = None,
) -> dict[str, Any]:
    text = solution_str or ""
    extra = ReasoningScoreExtra.read(extra_info)
    settings = extra.casereason or ReasoningRecord()
    k = settings.attempts
    final, tagged = extract_answer(text, settings.extraction)
    trace = "\n".join(_THINK.findall(model_text(text)))
    client = client if client is not None else asked_judge()
    calls = executed_calls(text, extra.case_env_tool_calls, registry.tool_parameters)
    attempts = attempts_of(calls, final)[:k]
    # the attempts in turn (the next is judged after a "no"), beside the recall's questions
    (first, how), recall = await asyncio.gather(
        first_correct(attempts, str(ground_truth), client),
        reasoning_recall(settings.statements, trace, client),
    )
    credit = 1 - (first - 1) / k if first else 0.0
    score = weighted(
        COMPONENTS, {"credit": credit, "recall": recall.value}, row_weights(COMPONENTS, extra.reward_weights)
    )
    return {
        "score": round(score, 6),
        "acc": 1.0 if first else 0.0,
        "pred": final or (attempts[-1] if attempts else ""),
        "format_ok": tagged and bool(trace.strip()),
        "judge": how,
        "judge_fallback": fell_back(how),
        "credit": round(credit, 6),
        "recall": round(recall.value, 6),
        "attempts": len(attempts),
        "first_correct": first,
    }
