"""Check 2: hostile input. Property-based (hypothesis) arguments for every tool, hostile patient, episode and
tool names, oversized and malformed bodies against the real server; and properties of the reward parser.

Whatever arrives, the answer is a clear 4xx or `ok: false` with a message, never a 5xx, a traceback, a file
path or another patient's data; and the server logs no unhandled error.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from case_env.core import registry
from case_env.core.registry import model_faults
from case_env.envs.imaging import rubric
from case_env.reward import FAILURE_KEYS, score_row
from tests.reliability.conftest import explore, size
from tests.reliability.conftest import json_values as any_json
from tests.server_harness import live_server

HOSTILE_TEXT = [
    "../../../../etc/passwd",
    "..\\..\\..\\windows\\win.ini",
    "/etc/shadow",
    "case0001/../case0002",
    "case0002",
    "\x00",
    "case0001\x00",
    "ｃａｓｅ０００１",
    "CASE0001",
    " case0001",
    "case0001 ",
    "case0001\n",
    "%2e%2e%2f%2e%2e%2f",
    "a" * 10_000,
    "\u202egnp.exe",
    "<script>alert(1)</script>",
    "'; DROP TABLE episodes;--",
    "{{7*7}}",
    "${jndi:ldap://x/a}",
    "💥" * 300,
    "\ufeff",
    "NaN",
    "-1",
    "1e999",
    "",
]
hostile_text = st.sampled_from(HOSTILE_TEXT) | st.text(max_size=300)
json_values = any_json(hostile_text, size=4, leaves=10)
TOOLS = registry.all_tools()
ERROR_MARKERS = ("Traceback", 'File "', "/tmp/", "site-packages", "Exception")


def _valid_values(spec: dict) -> st.SearchStrategy:
    if "enum" in spec:
        return st.sampled_from(spec["enum"])
    if spec.get("type") == "integer":
        return st.integers(spec.get("minimum", -(2**31)), spec.get("maximum", 2**31))
    if spec.get("type") == "number":
        return st.floats(spec.get("minimum", -1e9), spec.get("maximum", 1e9))
    if spec.get("type") == "boolean":
        return st.booleans()
    return st.sampled_from(["liver", "spleen", "pancreas", "left_kidney", "heart", "Liver "]) | hostile_text


@st.composite
def tool_arguments(draw, tool: str) -> dict:
    """Near-valid arguments: each schema property valid, hostile or missing, plus stray keys."""
    properties = TOOLS[tool].openai_schema()["function"]["parameters"]["properties"]
    arguments = {}
    for name, spec in properties.items():
        choice = draw(st.sampled_from(["valid", "valid", "hostile", "missing"]))
        if choice == "valid":
            arguments[name] = draw(_valid_values(spec))
        elif choice == "hostile":
            arguments[name] = draw(json_values)
    arguments.update(draw(st.dictionaries(hostile_text, json_values, max_size=2)))
    return arguments


@pytest.fixture(scope="module")
def live(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("hostile")) as server:
        yield server


class Tally:
    def __init__(self) -> None:
        self.statuses: Counter = Counter()
        self.problems: list[str] = []

    def check(self, response: httpx.Response, allowed: set[int], what: str) -> dict | None:
        self.statuses[response.status_code] += 1
        if response.status_code not in allowed:
            self.problems.append(f"{what}: HTTP {response.status_code} {response.text[:300]}")
        body = response.json()
        message = body.get("error", {}) and body["error"]["message"]
        if message and any(marker in message for marker in ERROR_MARKERS):
            self.problems.append(f"{what}: leaks internals: {message[:300]}")
        return body


TALLY = Tally()


def _post(live, tool: str, body: dict | bytes, headers: dict | None = None) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(
            f"{live.url}/v1/tools/{tool}",
            content=body,
            timeout=30,
            headers={"content-type": "application/json", **(headers or {})},
        )
    return httpx.post(f"{live.url}/v1/tools/{tool}", json=body, timeout=30)


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_hostile_arguments_of_every_tool(live, tool):
    @given(arguments=tool_arguments(tool), episode=st.integers(0, 10**9))
    @explore(size(ci=40, full=300))
    def call(arguments, episode):
        body = {"episode_id": f"hostile-{episode}", "patient_id": "case0003", "arguments": arguments}
        response = _post(live, tool, body)
        payload = TALLY.check(response, {200, 422}, f"{tool}({json.dumps(arguments)[:200]})")
        if response.status_code == 200 and not payload["ok"]:
            assert (
                payload["error"]["code"] in model_faults() and payload["text"] == payload["error"]["message"]
            )

    start = len(TALLY.problems)
    call()
    assert not TALLY.problems[start:], TALLY.problems[start:][:5]


def test_hostile_patient_episode_and_tool_names(live):
    @given(
        patient=hostile_text,
        episode=hostile_text | st.just("ok-episode"),
        tool=st.sampled_from(sorted(TOOLS)) | st.text(min_size=1, max_size=80).filter(lambda t: "/" not in t),
    )
    @explore(size(ci=150, full=1500))
    def call(patient, episode, tool):
        body = {"episode_id": episode, "patient_id": patient, "arguments": {}}
        response = httpx.post(f"{live.url}/v1/tools/{quote(tool, safe='')}", json=body, timeout=30)
        # only case0002 is a real id among the hostile ones; anything else is refused outright. A tool named
        # "." or ".." is a dot segment: the client resolves it to /v1/tools/ (405, GET only) or /v1/ (404).
        allowed = {200, 403, 404, 422} if patient == "case0002" else {404, 422}
        if tool in (".", ".."):
            allowed = {404, 405}
        TALLY.check(
            response, allowed, f"patient {patient[:40]!r} episode {episode[:40]!r} tool {tool[:40]!r}"
        )

    start = len(TALLY.problems)
    call()
    assert not TALLY.problems[start:], TALLY.problems[start:][:5]


MALFORMED = {
    "not json": b"this is not json",
    "truncated": b'{"episode_id": "e", "patient_id": "case0001", "argu',
    "array body": b"[1, 2, 3]",
    "string body": b'"case0001"',
    "null body": b"null",
    "empty body": b"",
    "nested 20k deep": b"[" * 20_000 + b"]" * 20_000,
    "arguments 5k deep": b'{"episode_id":"e","patient_id":"case0001","arguments":'
    + b'{"a":' * 5000
    + b"1"
    + b"}" * 5001,
    "NaN position": b'{"episode_id":"e","patient_id":"case0001","arguments":{"visit":"baseline","sequence":"fat",'
    b'"plane":"axial","position":NaN}}',
    "huge number": b'{"episode_id":"e","patient_id":"case0001","arguments":{"visit":"baseline","sequence":"fat",'
    b'"plane":"axial","position":' + b"9" * 5000 + b"}}",
    "lone surrogate": b'{"episode_id":"e","patient_id":"case0001","arguments":{"section":"\\ud800"}}',
    "invalid utf-8": b'{"episode_id":"e","patient_id":"case0001","arguments":{"section":"\xff\xfe"}}',
    "extra top-level key": b'{"episode_id":"e","patient_id":"case0001","arguments":{},"admin":true}',
    "arguments not an object": b'{"episode_id":"e","patient_id":"case0001","arguments":"--organ liver"}',
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_bodies_are_refused_with_422(live, name):
    tool = "render_slice" if "position" in name else "get_clinical_context"
    response = _post(live, tool, MALFORMED[name])
    body = TALLY.check(response, {200, 422}, name)
    assert response.status_code == 422 or (response.status_code == 200 and not body["ok"]), response.text


def test_oversized_bodies_are_refused_with_413(live):
    start = len(TALLY.problems)
    big = {"episode_id": "e", "patient_id": "case0001", "arguments": {"organ": "x" * 70_000}}
    assert TALLY.check(_post(live, "get_organ_volume", big), {413}, "oversized body") is not None

    def chunks():  # no Content-Length: the limit must hold while streaming
        yield b'{"episode_id": "e", "patient_id": "case0001", "arguments": {"organ": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}}'

    response = httpx.post(
        f"{live.url}/v1/tools/get_organ_volume",
        content=chunks(),
        timeout=30,
        headers={"content-type": "application/json"},
    )
    TALLY.check(response, {413}, "oversized streamed body")
    wrong_type = httpx.post(
        f"{live.url}/v1/tools/list_visits", content=b"{}", timeout=30, headers={"content-type": "text/plain"}
    )
    TALLY.check(wrong_type, {422}, "text/plain body")
    assert not TALLY.problems[start:], TALLY.problems[start:][:5]


# --- the reward parser -------------------------------------------------------------------------------------

answer_free_text = st.text(st.characters(blacklist_characters="ABCDE<>\\{}"), max_size=400)


@given(
    solution=st.text(max_size=2000) | st.sampled_from(HOSTILE_TEXT),
    truth=st.text(max_size=8),
    source=st.text(max_size=30),
)
@explore(size(ci=400, full=5000))
def test_reward_is_total(solution, truth, source):
    """Any input scores: the four keys (and the rubric's, unweighted), score and acc equal and 0 or 1, never an
    exception."""
    result = score_row(source, solution, truth)
    assert set(result) == {"score", "acc", "pred", "format_ok", *rubric.KEYS, *FAILURE_KEYS}
    assert result["score"] == result["acc"] and result["score"] in (0.0, 1.0)
    assert result["score"] == 0.0 or result["pred"] == truth.strip().strip("()").upper()


@given(
    before=st.text(max_size=400),
    inside=st.text(max_size=400),
    after=answer_free_text,
    truth=st.sampled_from("ABCD"),
)
@explore(size(ci=300, full=3000))
def test_a_tool_response_never_answers(before, inside, after, truth):
    """Whatever a tool returned, if the model wrote no answer letter after it, the score is 0."""
    solution = f"{before}<tool_response>{inside}<answer>{truth}</answer></tool_response>{after}"
    assert score_row("x", solution, truth)["score"] == 0.0


@given(
    reasoning=st.text(max_size=400),
    letter=st.sampled_from("ABCD"),
    truth=st.sampled_from("ABCD"),
    trailing=st.text(" \n\t.", max_size=5),
)
@explore(size(ci=300, full=3000))
def test_a_final_answer_scores_exactly_when_right(reasoning, letter, truth, trailing):
    result = score_row("x", f"<think>{reasoning}</think>\n<answer>{letter}</answer>{trailing}", truth)
    if "</think>" in reasoning:
        return  # the reasoning closed its own block early: what follows is not an answer-only tail
    assert result["pred"] == letter and result["format_ok"]
    assert result["score"] == (1.0 if letter == truth else 0.0)


def _more_than_closing_punctuation(tail: str) -> bool:
    return any(not (c.isspace() or c in ".!)]*_`'\"") for c in tail)


@given(
    letter=st.sampled_from("ABCD"),
    tail=st.text(min_size=1, max_size=200).filter(_more_than_closing_punctuation),
)
@explore(size(ci=300, full=3000))
def test_nothing_may_follow_the_answer(letter, tail):
    assert score_row("x", f"<answer>{letter}</answer>{tail}", letter)["score"] == 0.0 or (
        score_row("x", tail, letter)["score"] == 1.0  # the tail is itself a later, valid answer
    )


def test_hostile_input(live, figures):
    """Runs last in this module: the figures of the HTTP checks above (the autouse fixture below has already
    shown that the server logged no unhandled error during any of them)."""
    figures.update(
        {
            "requests": sum(TALLY.statuses.values()),
            "status_counts": {str(k): v for k, v in sorted(TALLY.statuses.items())},
            "status_5xx": sum(n for k, n in TALLY.statuses.items() if k >= 500),
            "problems": len(TALLY.problems),
        }
    )
    assert not TALLY.problems
    assert figures["status_5xx"] == 0 and figures["requests"] > 0


@pytest.fixture(autouse=True)
def _no_server_errors(caplog):
    with caplog.at_level(logging.ERROR, logger="case_env.server"):
        yield
    unhandled = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not unhandled, unhandled
