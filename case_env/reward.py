"""The reward: does the final answer's letter match `reward_model.ground_truth`?

One pure function serves verl (`reward.custom_reward_function`), the server (`POST /v1/score`) and eval.
verl hands it the whole decoded response, every assistant turn *and every tool response*
(shared/reference/verl-0.9.1.md section 3), so only the text after the last tool response is read: a tool
output can never answer. Inside that text, `<think>` blocks are ignored and the last answer wins; it must be
the last thing written. Accepted forms: `<answer>X</answer>`, `\\boxed{X}` and a final `Answer: X`. An answer
naming two different letters ("A or B"), a missing answer, text or a tool call after the answer, and
look-alike letters (Cyrillic, full-width) all score 0. Every return has the same keys, as verl's reward
manager requires.
"""

from __future__ import annotations

import json
import re
from typing import Any

LETTERS = "ABCDE"
_TOOL_RESPONSE_END = "</tool_response>"
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_ANSWER_FORMS = [
    re.compile(r"<answer>(.*?)</answer>", re.DOTALL),
    re.compile(r"\\boxed\{([^{}]*)\}"),
    re.compile(r"(?im)^[ \t*_#]*(?:final\s+)?answer\s*[:：]\s*(.+?)\s*$"),
]
_LEADING_LETTER = re.compile(r"^[\s*_(\[]*([A-E])(?![A-Za-z0-9])")
_STANDALONE_LETTER = re.compile(r"(?<![A-Za-z0-9])([A-E])(?![A-Za-z0-9])")
_TRAILING_OK = re.compile(r"^[\s.!)\]*_`'\"]*$")


def final_segment(solution_str: str) -> str:
    """What the model wrote after the last tool response, without its <think> blocks."""
    tail = solution_str.rsplit(_TOOL_RESPONSE_END, 1)[-1]
    return _THINK.sub("", tail)


_TOOL_RESPONSE = re.compile(r"<tool_response>.*?(?:</tool_response>|$)", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def model_text(solution_str: str) -> str:
    """The trajectory without its tool responses: only what the model itself wrote."""
    return _TOOL_RESPONSE.sub("", solution_str or "")


def tool_calls(solution_str: str) -> list[tuple[str, dict]]:
    """(name, arguments) of every tool call the model wrote, in order, read as verl's Hermes parser reads them
    (a JSON object in <tool_call> tags); tool responses are not read."""
    calls = []
    for body in _TOOL_CALL.findall(model_text(solution_str)):
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments")
            calls.append((call["name"], arguments if isinstance(arguments, dict) else {}))
    return calls


def last_answer(text: str, forms: list[re.Pattern] = _ANSWER_FORMS) -> str | None:
    """The content of the last answer in `text`, or None when there is none or something follows it."""
    found = []
    for form in forms:
        found += [(m.start(), m.end(), m.group(1)) for m in form.finditer(text)]
    if not found:
        return None
    _start, end, content = max(found)  # the last answer wins
    if not _TRAILING_OK.match(text[end:]):
        return None  # something (a tool call, more reasoning) follows the answer
    return content


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


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """verl custom reward: {"score", "acc", "pred", "format_ok"} for every input of the imaging banks; a
    clinic row (data_source clinic_*) gets the clinic reward and a case-reasoning row (casereason) its own, each
    with its own fixed keys (`case_env.clinic.reward`, `case_env.casereason.reward`). One verl batch should
    hold rows of one environment."""
    if str(data_source).startswith("clinic_"):
        from case_env.clinic.reward import clinic_score

        return clinic_score(solution_str, ground_truth, extra_info)
    if data_source == "casereason":
        from case_env.casereason.reward import casereason_score

        return casereason_score(solution_str, ground_truth, extra_info)
    pred, well_formed = parse_answer(final_segment(solution_str or ""))
    truth = str(ground_truth).strip().strip("()").upper()
    correct = pred is not None and pred == truth
    return {"score": 1.0 if correct else 0.0, "acc": 1.0 if correct else 0.0, "pred": pred or "",
            "format_ok": well_formed}  # fmt: skip
