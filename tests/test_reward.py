"""The reward function: accepted answer forms, and everything that must score 0."""

from __future__ import annotations

import pytest

from case_env.envs.imaging import rubric
from case_env.reward import FAILURE_KEYS, score_row

TOOL = '<tool_call>\n{"name": "get_organ_volume", "arguments": {"organ": "liver", "visit": "baseline"}}\n</tool_call>'
RESPONSE = "user\n<tool_response>\n{text}\n</tool_response>\nassistant\n"


COMMON = ("score", "acc", "pred", "format_ok")
KEYS = {
    *COMMON,
    *rubric.KEYS,
    *FAILURE_KEYS,
}  # the letter's keys, then CASE's rubric (weight 0 here: the letter alone)


def common(result: dict) -> dict:
    assert set(result) == KEYS
    return {k: result[k] for k in COMMON}


def score(final: str, truth: str = "B", tool_text: str = "Liver at baseline: volume 1,634.8 mL.") -> dict:
    solution = f"I will measure the liver.\n{TOOL}\n" + RESPONSE.format(text=tool_text) + final
    return score_row("vista3d_opsd", solution, truth, {"patient_id": "case0001"})


@pytest.mark.parametrize(
    "final",
    [
        "The liver measures 1,634.8 mL, option B.\n<answer>B</answer>",
        "<answer> B </answer>",
        "<answer>(B)</answer>",
        "<answer>B) 1,634.8 mL</answer>",
        "Therefore the answer is \\boxed{B}.",
        "Volume 1,634.8 mL.\nAnswer: B",
        "Answer: (B)",
        "**Answer:** B",
        "First I thought <answer>C</answer> but the volume says B.\n<answer>B</answer>",
        "<think>Maybe A? Answer: A</think>The measurement matches B.\n<answer>B</answer>",
        "<answer>B</answer>\n",
    ],
)
def test_accepted_forms_score_one(final):
    result = score(final)
    assert common(result) == {"score": 1.0, "acc": 1.0, "pred": "B", "format_ok": True}


def test_a_wrong_letter_scores_zero_but_is_well_formed():
    assert common(score("<answer>C</answer>")) == {"score": 0.0, "acc": 0.0, "pred": "C", "format_ok": True}


@pytest.mark.parametrize(
    ("final", "tool_text"),
    [
        ("", "Answer: B"),  # the answer appears only inside the tool output
        ("I cannot tell.", "<answer>B</answer>"),
        ("<answer>A or B</answer>", ""),
        ("<answer>B, A</answer>", ""),
        ("<answer>B</answer> and then <answer>A or B</answer>", ""),
        ("<answer>B", ""),  # unclosed tag
        ("<answer></answer>", ""),
        ("<answer>B</answer>\n" + TOOL, ""),  # the answer is followed by another tool call
        ("<answer>B</answer> Let me double-check with another tool.", ""),
        ("<answer>\u0412</answer>", ""),  # Cyrillic capital VE, looks like B
        ("<answer>\uff22</answer>", ""),  # full-width B
        ("<answer>b</answer>", ""),
        ("B", ""),
        ("The answer is B.", ""),
        ("", ""),
    ],
)
def test_rejected_forms_score_zero(final, tool_text):
    result = score(final, tool_text=tool_text or "Liver volume 1,634.8 mL.")
    assert result["score"] == 0.0 and result["acc"] == 0.0
    assert set(result) == KEYS


def test_reasoning_letter_does_not_count_against_a_different_final_answer():
    result = score("Option A looked plausible at first.\n<answer>B</answer>")
    assert result["score"] == 1.0
    result = score("<answer>B</answer> was my first idea.\n<answer>A</answer>")
    assert result["score"] == 0.0 and result["pred"] == "A"


def test_ground_truth_spelling_and_missing_tool_turns():
    assert score_row("x", "<answer>D</answer>", "(d)")["score"] == 1.0
    assert score_row("x", "<answer>D</answer>", " D ")["score"] == 1.0
    assert common(score_row("x", None, "D")) == {"score": 0.0, "acc": 0.0, "pred": "", "format_ok": False}


def test_a_fake_tool_response_end_in_the_answer_is_still_the_models_text():
    result = score("</tool_response>\nAnswer: C")
    assert result["pred"] == "C"
