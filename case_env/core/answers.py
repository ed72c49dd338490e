"""Reading the final answer out of a trajectory, as every environment's reward does.

verl hands the reward the whole decoded response, every assistant turn *and every tool response*
(docs/architecture.md, "The reward"), so only the text after the last tool response is read: a tool output
can never answer. Inside that text `<think>` blocks are ignored and the last answer wins; it must be the
last thing written, or it does not count.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from case_env.core.tags import Tagged, TagMatch

TOOL_RESPONSE_END = "</tool_response>"
_THINK = Tagged("<think>", "</think>", to_end=True)
TOOL_RESPONSE = Tagged("<tool_response>", "</tool_response>", to_end=True)
ANSWER_TAG = Tagged("<answer>", "</answer>")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class _AnswerLines:
    """`Answer: X` and `Final answer: X` lines; the content runs to the end of its line, trailing space left
    out. The whitespace before the content is taken whole (possessively): the lazy form `(.+?)\\s*$` it
    replaces was quadratic on a line of spaces ending in a letter (docs/architecture.md, "The reward")."""

    _LINE = re.compile(r"(?im)^[ \t*_#]*+(?:final\s+)?answer\s*[:：]\s*+(\S.*)")

    def finditer(self, text: str) -> Iterator[TagMatch]:
        for found in self._LINE.finditer(text):
            start = found.start(1)
            end = start + len(found.group(1).rstrip())
            yield TagMatch(text, found.start(), end, start, end)


ANSWER_LINE = _AnswerLines()
ANSWER_FORMS = (ANSWER_TAG, BOXED, ANSWER_LINE)
_TRAILING_OK = re.compile(r"^[\s.!)\]*_`'\"]*$")


def final_segment(solution_str: str) -> str:
    """What the model wrote after the last tool response, without its <think> blocks."""
    tail = (solution_str or "").rsplit(TOOL_RESPONSE_END, 1)[-1]
    return _THINK.sub("", tail)


def model_text(solution_str: str) -> str:
    """The trajectory without its tool responses: only what the model itself wrote."""
    return TOOL_RESPONSE.sub("", solution_str or "")


def last_answer(text: str, forms: tuple = ANSWER_FORMS) -> str | None:
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
