"""Check 11 (issue 31): every reader of model text runs in linear time, on the degenerate outputs a policy
writes in RL (one tag repeated for a whole 64k-token response, unclosed tags, both call formats mixed), and
reads what the regexes it replaced read.

Equivalence: the one-pass scanners (`case_env.core.tags`) against the patterns they replace, kept here as the
reference, on text drawn from tag fragments. Time: the issue's exact inputs, then drawn text repeated to
256k characters, scored by every environment's reward; a bound per character with a wide margin (the
quadratic readers took 20-42 s for 200k characters), and the cost of 8x the text within 24x the cost
(linear is 8x, quadratic 64x), both measured in the same run.
"""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from case_env.core.answers import ANSWER_TAG, TOOL_RESPONSE, _AnswerLines, final_segment, last_answer
from case_env.core.calls import TOOL_CALL
from case_env.envs.casereason.reward import _THINK as REASONING
from case_env.envs.clinic.reward import DIAGNOSIS_TAG
from case_env.reward import score_row
from tests.reliability.conftest import explore, size

# the patterns the scanners replace, as they were at 84b9f1d
OLD = {
    "tool_call": (TOOL_CALL, re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)),
    "answer": (ANSWER_TAG, re.compile(r"<answer>(.*?)</answer>", re.DOTALL)),
    "tool_response": (TOOL_RESPONSE, re.compile(r"<tool_response>(.*?)(?:</tool_response>|$)", re.DOTALL)),
    "think": (REASONING, re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)),
    "diagnosis": (DIAGNOSIS_TAG, re.compile(r"\[DIAGNOSIS:\s*(.+?)\]", re.IGNORECASE | re.DOTALL)),
}
OLD_LINE = re.compile(r"(?im)^[ \t*_#]*(?:final\s+)?answer\s*[:：]\s*(.+?)\s*$")
FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
    "[DIAGNOSIS:",
    "[diagnosis: ",
    "]",
    "<function=ct>",
    "<parameter=region>",
    "</parameter>",
    "</function>",
    '{"name": "cbc", "arguments": {}}',
    "Answer: ",
    "final answer:",
    "\\boxed{B}",
    " ",
    "  ",
    "\n",
    "\t",
    "B",
    "x",
    "*",
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)
# the exact inputs of the issue, and the other shapes the readers were quadratic on
DEGENERATE = {
    "<tool_call> x 18,000": "<tool_call>" * 18_000,
    "<answer> x 25,000": "<answer>" * 25_000,
    "[DIAGNOSIS: x x 15,000": "[DIAGNOSIS: x" * 15_000,
    "<tool_call><function= x 10,000": "<tool_call><function=" * 10_000,
    "<parameter= x 20,000 in one call": "<tool_call><function=ct>" + "<parameter=" * 20_000 + "</tool_call>",
    "answer line of 200k spaces": "Answer: B" + " " * 200_000 + "C",
    "<think> x 25,000": "<think>" * 25_000,
}
ROWS = [
    ("vista3d_opsd", "B", {"env": "imaging"}),
    ("medexagent", "pneumonia", {"env": "clinic"}),
    ("casereason", "gout", {"env": "casereason"}),
]
PER_CHARACTER_S = 5e-6  # 1.3 s for 256k characters; the linear readers take tens of milliseconds


def spans(found) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group(1)) for m in found]


@explore(size(400, 4000))
@given(text=texts)
def test_the_scanners_find_what_the_regexes_found(text):
    for name, (new, old) in OLD.items():
        assert spans(new.finditer(text)) == spans(old.finditer(text)), name
        assert new.split(text) == old.split(text)[::2], (
            name
        )  # the regex's list holds its group between pieces


def old_last_answer(text: str) -> str | None:
    """`last_answer` with the answer-line regex of 84b9f1d."""
    from case_env.core.answers import BOXED

    return last_answer(text, (OLD["answer"][1], BOXED, OLD_LINE))


def blank_is_none(answer: str | None) -> str | None:
    return (answer.strip() or None) if answer is not None else None


@explore(size(400, 4000))
@given(text=texts)
def test_answers_read_as_before(text):
    """The one difference: an answer line holding only whitespace read as a one-space answer before, and
    reads as no answer now; every reward treats both as no answer."""
    assert blank_is_none(last_answer(text)) == blank_is_none(old_last_answer(text))
    assert last_answer(text, (_AnswerLines(),)) == (
        None if blank_is_none(before := last_answer(text, (OLD_LINE,))) is None else before
    )


def score_times(text: str) -> dict[str, float]:
    times = {}
    for source, truth, extra in ROWS:
        began = time.perf_counter()
        result = score_row(source, text, truth, dict(extra))
        times[extra["env"]] = time.perf_counter() - began
        assert result["format_ok"] in (True, False)
    return times


def test_degenerate_outputs_score_in_linear_time(figures):
    score_row(*ROWS[1][:2], dict(ROWS[1][2]))  # imports and the tool registry, once
    worst = {}
    for name, text in DEGENERATE.items():
        times = score_times(text)
        env, seconds = max(times.items(), key=lambda item: item[1])
        worst[name] = {"chars": len(text), "worst_s": round(seconds, 4), "env": env}
    figures["degenerate"] = worst
    figures["worst_s"] = max(w["worst_s"] for w in worst.values())
    for name, w in worst.items():
        assert w["worst_s"] < PER_CHARACTER_S * w["chars"], (name, w)


@explore(size(12, 60))
@given(unit=texts.filter(lambda t: len(t) >= 8))
def test_drawn_text_repeated_to_a_64k_token_response_scores_in_linear_time(unit):
    text = unit * (262_144 // len(unit) + 1)
    small = text[: len(text) // 8]

    def best(sample: str) -> float:
        return min(max(score_times(sample).values()) for _ in range(3))

    large, short = best(text), best(small)
    assert large < PER_CHARACTER_S * len(text)
    assert large < 32 * max(short, 1e-3), (large, short)  # linear: 8x the text, 8x the time


def test_the_tail_decides_after_a_degenerate_prefix():
    """A looping prefix does not hide the answer the model wrote last."""
    text = "<tool_call>" * 18_000 + "\n<answer>B</answer>"
    assert final_segment(text).endswith("<answer>B</answer>")
    assert score_row("vista3d_opsd", text, "B", {"env": "imaging"})["acc"] == 1.0
    assert score_row("medexagent", "[DIAGNOSIS: x" * 15_000 + "]", "x", {"env": "clinic"})["pred"]


@pytest.mark.parametrize(
    "text", ["[DIAGNOSIS:  ]", "[diagnosis: gout]", "[DIAGNOSIS:]]", "[DIAGNOSIS: a] b]"]
)
def test_the_diagnosis_tag_reads_as_medexagents_pattern(text):
    old = OLD["diagnosis"][1].search(text)
    new = DIAGNOSIS_TAG.search(text)
    assert (new.group(1) if new else None) == (old.group(1) if old else None)


def test_the_server_scores_a_degenerate_row_without_stalling_and_a_slow_judge_past_its_deadline(
    dataset, tmp_path, monkeypatch, figures
):
    """At 84b9f1d one such /v1/score held the whole server for 41 s (/healthz waited as long)."""
    import threading

    import httpx

    from case_env.core.llm import default_judge
    from tests.chat_stub import ScriptedChat
    from tests.server_harness import live_server, serve_app

    judge = ScriptedChat(lambda messages: '{"gt_count": 1, "pred_count": 1, "matched": 1}', delay_s=5.0)
    with serve_app(judge.app) as slow, live_server(dataset, tmp_path, score_deadline_s=1.0) as server:
        monkeypatch.setenv("CASE_ENV_JUDGE_URL", f"{slow.url}/v1")
        default_judge.cache_clear()
        try:
            row = {"data_source": "medexagent", "ground_truth": "x", "extra_info": {"env": "clinic"}}
            health: list[float] = []

            def poll() -> None:
                began = time.perf_counter()
                httpx.get(f"{server.url}/healthz", timeout=60).raise_for_status()
                health.append(time.perf_counter() - began)

            began = time.perf_counter()
            poller = threading.Thread(target=poll)
            with httpx.Client(timeout=60) as client:
                pending = threading.Thread(
                    target=lambda: client.post(
                        f"{server.url}/v1/score", json={**row, "solution_str": "<tool_call>" * 18_000}
                    )
                )
                pending.start()
                poller.start()
                pending.join()
                poller.join()
                degenerate_s = time.perf_counter() - began
                # a diagnosis only a judge can decide, and a judge slower than the deadline
                began = time.perf_counter()
                reply = client.post(
                    f"{server.url}/v1/score",
                    json={
                        **row,
                        "ground_truth": "Morbus Whipple",
                        "solution_str": "[DIAGNOSIS: Whipple disease]",
                    },
                ).json()
                judged_s = time.perf_counter() - began
        finally:
            default_judge.cache_clear()
    figures.update(
        degenerate_score_s=round(degenerate_s, 3), healthz_s=round(health[0], 3), deadline_s=judged_s
    )
    assert degenerate_s < 2.0 and health[0] < 2.0
    assert len(judge.requests) == 1 and 1.0 <= judged_s < 4.0
    assert (reply["score"], reply["format_ok"], reply["pred"]) == (0.0, False, "")
    assert reply["reason"] == "scoring took longer than its deadline of 1 s (CASE_ENV_SCORE_DEADLINE_S)"
