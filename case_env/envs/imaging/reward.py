"""The imaging reward: does the final answer's letter match `reward_model.ground_truth`? Plus CASE's rubric
(`rubric.py`), weighted by the row's `reward_weights.rubric` (0 unless a `case` recipe or the bank sets it);
its keys are in every row's reward either way.

Read from the final segment only (`case_env.core.answers`). Accepted forms: `<answer>X</answer>`,
`\\boxed{X}` and a final `Answer: X`. An answer naming two different letters ("A or B"), a missing answer,
text or a tool call after the answer, and look-alike letters (Cyrillic, full-width) all score 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from case_env.core import llm
from case_env.core.answers import final_segment, last_answer
from case_env.core.calls import ScoreExtra
from case_env.core.environment import Component, Score, row_weights, weighted
from case_env.envs.imaging import rubric
from case_env.envs.imaging.rubric import ImagingScoreExtra

COMPONENTS = (
    Component("acc", 1.0, "the answer's letter is the truth's"),
    Component(
        "rubric",
        0.0,
        "CASE's rubric: the share of its items that apply and are met (values, visits, grounded, "
        "follows), graded by the judge, or the rules",
    ),
)

_LEADING_LETTER = re.compile(r"^[\s*_(\[]*([A-E])(?![A-Za-z0-9])")
_STANDALONE_LETTER = re.compile(r"(?<![A-Za-z0-9])([A-E])(?![A-Za-z0-9])")


def parse_answer(text: str) -> tuple[str | None, bool]:
    """(letter, well_formed) of the last answer in `text`; letter None when there is no usable answer."""
    content = last_answer(text)
    if content is None:
        return None, False
    lead = _LEADING_LETTER.match(content)
    if lead is None:
        return None, False
    letters = set(_STANDALONE_LETTER.findall(content))
    if letters - {lead.group(1)}:
        return None, False  # "A or B": two different letters in one answer
    return lead.group(1), True


def letter_score(solution_str: str, ground_truth: str) -> Score:
    pred, well_formed = parse_answer(final_segment(solution_str))
    truth = str(ground_truth).strip().strip("()").upper()
    correct = 1.0 if pred is not None and pred == truth else 0.0
    return Score(correct, correct, pred or "", well_formed)


async def rubric_score(
    solution_str: str, ground_truth: str, extra_info: ScoreExtra | Mapping | None
) -> Score:
    """The letter's reward plus the weighted rubric; the judge is asked only when the rubric counts."""
    extra = ImagingScoreExtra.read(extra_info)
    base = letter_score(solution_str, ground_truth)
    weights = row_weights(COMPONENTS, extra.reward_weights)
    client = llm.asked_judge() if rubric.judged(weights["rubric"]) else None
    graded = await rubric.grade(solution_str, extra, base.acc == 1.0, client)
    score = weighted(COMPONENTS, {"acc": base.acc, "rubric": graded["rubric"]}, weights)
    return Score(score, base.acc, base.pred, base.format_ok, graded)
