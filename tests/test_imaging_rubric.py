"""CASE's rubric (case_env/envs/imaging/rubric.py) on recorded trajectories: the scripted agent, which gathers
the evidence and cites it, against the no-tool agent, which answers from the question alone, both played by
the eval runner against a live server; answers that cite values no tool returned; the judge's grades and
the rules that bound them; the weight in the reward."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from case_env.core.llm import ModelReply
from case_env.envs.imaging import rubric
from case_env.eval.runner import run_eval
from case_env.reward import score_row
from tests import blocking
from tests.reliability.test_reward_hacking import EXTRA, HONEST, ONE_CALL, RUBRIC_HACKS, RUBRIC_TURN
from tests.server_harness import live_server
from tests.test_judge_scale import judge_at  # noqa: F401 (a fixture)
from tests.verl_rows import build_bank

grade = blocking(rubric.grade)

EVIDENCE_ITEMS = ("values", "visits", "grounded", "follows")


@pytest.fixture(scope="module")
def recorded(dataset, tmp_path_factory):
    """Both agents' trajectories over the whole bank, as `case-env eval` records them."""
    tmp = tmp_path_factory.mktemp("rubric")
    bank = build_bank(dataset, tmp / "bank")
    runs = {}
    with live_server(dataset, tmp / "server") as live:
        for agent in ("scripted", "no-tool"):
            run_eval(bank, live.url, agent, tmp / agent, progress=False)
            lines = (tmp / agent / "trajectories.jsonl").read_text().splitlines()
            runs[agent] = [json.loads(line) for line in lines]
    extras = {}
    from case_env.core.bank import load_items

    for item in load_items(bank):
        extras[item.key] = item.extra
    return runs, extras


def item_means(records: list[dict], extras: dict) -> dict[str, tuple[float, int]]:
    """Each item's mean over the rows it applies to, and how many those are."""
    out = {}
    for item in EVIDENCE_ITEMS:
        rows = [
            r
            for r in records
            if rubric.Rubric.of(rubric.ImagingScoreExtra.read(extras[r["question_id"]])).applicable()[item]
        ]
        out[item] = (sum(r["score"][f"rubric_{item}"] for r in rows) / len(rows), len(rows))
    return out


def test_the_scripted_agent_scores_higher_than_the_no_tool_agent_on_every_evidence_item(recorded):
    runs, extras = recorded
    scripted, no_tool = item_means(runs["scripted"], extras), item_means(runs["no-tool"], extras)
    print({"scripted": scripted, "no-tool": no_tool})  # the figures of the closing note (pytest -s)
    for item in EVIDENCE_ITEMS:
        assert scripted[item][1] == no_tool[item][1] > 0
        assert scripted[item][0] > no_tool[item][0], item
    assert all(r["score"]["rubric"] == 0.0 for r in runs["no-tool"])  # it cites nothing a tool returned
    assert all(r["score"]["rubric_by"] == "rules" for r in runs["scripted"] + runs["no-tool"])


def test_every_row_has_the_same_keys(recorded):
    runs, _extras = recorded
    keys = {tuple(r["score"]) for run in runs.values() for r in run}
    assert len(keys) == 1
    assert set(rubric.KEYS) <= set(next(iter(keys)))


class Judge:
    """Stands in for the judge endpoint: replies with `text` (None: the endpoint failed), counting asks."""

    def __init__(self, text: str | None):
        self.text, self.asked = text, []

    async def acomplete(self, messages, temperature=None, fresh=False):
        self.asked.append(messages)
        return None if self.text is None else ModelReply(self.text, False)


ALL_MET = json.dumps({"values": 1, "grounded": 1, "follows": 1})


def test_an_honest_answer_meets_the_rubric_by_the_rules_and_the_judge():
    by_rules = grade(HONEST, {**EXTRA, **ONE_CALL}, True, None)
    assert by_rules["rubric_values"] == by_rules["rubric_grounded"] == by_rules["rubric_follows"] == 1.0
    assert by_rules["rubric_visits"] == 0.0 and by_rules["rubric_applicable"] == 3  # a one-visit question
    assert by_rules["rubric"] == 1.0 and by_rules["rubric_by"] == "rules"
    judge = Judge(ALL_MET)
    by_judge = grade(HONEST, {**EXTRA, **ONE_CALL}, True, judge)
    assert by_judge["rubric"] == 1.0 and by_judge["rubric_by"] == "judge"
    prompt = judge.asked[0][1]["content"]
    assert "1,634.8 mL" in prompt and '"visits"' not in prompt and "1634.8 mL" in prompt


@pytest.mark.parametrize("name", sorted(RUBRIC_HACKS))
def test_answers_citing_values_no_tool_returned_score_0_on_those_items(name):
    text, recorded = RUBRIC_HACKS[name]
    for client in (None, Judge(ALL_MET)):  # a judge that credits everything is bounded by the rules
        grades = grade(text, {**EXTRA, **recorded}, True, client)
        # a conclusion resting on a value no tool returned does not follow from the evidence either
        assert grades["rubric_values"] == grades["rubric_grounded"] == grades["rubric_follows"] == 0.0, name


@pytest.mark.parametrize(
    ("reply", "by"),
    [
        ("no grades here", "rejected"),
        ('{"values": 1, "grounded": 1}', "rejected"),  # an item missing
        ('{"values": 1, "grounded": 2, "follows": 1}', "rejected"),  # out of range
        ('{"values": true, "grounded": 1, "follows": 1}', "rejected"),
        (None, "unavailable"),
    ],
)
def test_a_judge_out_of_form_leaves_the_grades_to_the_rules(reply, by):
    grades = grade(HONEST, {**EXTRA, **ONE_CALL}, True, Judge(reply))
    assert grades["rubric_by"] == by and grades["rubric"] == 1.0


def test_the_weight_adds_the_rubric_to_the_answer_and_only_then_asks_the_judge(monkeypatch):
    from case_env.core import llm

    judge = Judge(json.dumps({"values": 1, "grounded": 1, "follows": 0}))
    monkeypatch.setattr(llm, "asked_judge", lambda: judge)
    extra = {**EXTRA, **ONE_CALL, "env": "imaging"}
    plain = score_row("vista3d_opsd", HONEST, "A", extra)
    assert plain["score"] == 1.0 and plain["rubric"] == 1.0 and judge.asked == []
    extra["reward_weights"] = {"rubric": 0.5}  # the row's weight, as a bank or a recipe sets it
    weighted = score_row("vista3d_opsd", HONEST, "A", extra)
    assert len(judge.asked) == 1 and weighted["rubric_by"] == "judge"
    assert weighted["rubric"] == pytest.approx(2 / 3) and weighted["score"] == pytest.approx(1 + 0.5 * 2 / 3)
    wrong = score_row("vista3d_opsd", HONEST.replace("<answer>A", "<answer>B"), "A", extra)
    assert wrong["acc"] == 0.0 and wrong["score"] == pytest.approx(0.5 * wrong["rubric"])
    assert set(plain) == set(weighted) == set(wrong)


def test_values_match_at_the_precision_they_were_written():
    (tool,) = rubric.values_in("volume 1,634.8 mL")
    assert tool.matches(rubric.values_in("1635 mL")[0]) and tool.matches(rubric.values_in("1634.8 ml")[0])
    assert not tool.matches(rubric.values_in("1,634.9 mL")[0]) and not tool.matches(
        rubric.values_in("1634.8 %")[0]
    )
    assert rubric.values_in("+5.6 %")[0].matches(rubric.values_in("5.6 %")[0])
    assert rubric.values_in("K76.0 Fatty liver; station 3, segment VIII") == []  # no unit, no value
    left, right = rubric.values_in("left 155.2 mL, right 176.8 mL")
    assert any(rubric.values_in("larger by 13.9 %")[0].matches(v) for v in rubric.derived([left, right]))
    assert rubric.quotes(
        'It reads: "no significant abnormality of the solid organs"', "1. No significant abnormality of"
    )
    assert not rubric.quotes("no significant change", "1. No significant abnormality of")
    assert rubric.question_visits([rubric.EvidenceCall(tool="compare_organ_volume", arguments={})]) == {
        "baseline",
        "follow_up",
    }


def test_the_judge_at_an_endpoint_grades_through_the_coroutine_reward(judge_at):  # noqa: F811
    """verl's entry point with the judge at a loopback stand-in: one request per row, its grades in the
    reward, the rules' bound on a hack, and the same keys when the judge fails."""
    import asyncio

    import case_env.reward
    from case_env.bench.standin import StandInProcess

    reply = json.dumps({"values": 1, "grounded": 1, "follows": 0})
    extra = {**EXTRA, **ONE_CALL, "env": "imaging", "reward_weights": {"rubric": 0.5}}
    hack, recorded = RUBRIC_HACKS["a value no tool returned"]
    with StandInProcess(reply=reply) as judge, judge_at(judge):
        honest = asyncio.run(case_env.reward.compute_score("vista3d_opsd", HONEST, "A", extra))
        hacked = asyncio.run(case_env.reward.compute_score("vista3d_opsd", hack, "A", {**extra, **recorded}))
        assert judge.stats()["requests"] == 2
    assert honest["rubric_by"] == hacked["rubric_by"] == "judge"
    assert honest["rubric"] == pytest.approx(2 / 3) and honest["score"] == pytest.approx(1 + 1 / 3)
    assert hacked["rubric_values"] == hacked["rubric_grounded"] == 0.0  # the judge's 1s, bounded by the rules
    unasked = HONEST.replace("option A", "so A")  # a text the judge's cache has not seen
    with StandInProcess(failure_rate=1.0) as judge, judge_at(judge, RETRIES=0):
        failed = asyncio.run(case_env.reward.compute_score("vista3d_opsd", unasked, "A", extra))
    assert failed["rubric_by"] == "unavailable" and failed["rubric"] == 1.0 and set(failed) == set(honest)


value = st.builds(
    rubric.Value,
    st.floats(-5000, 5000, allow_nan=False).map(lambda x: round(x, 4)),
    st.sampled_from(["mL", "%", "mm"]),
    st.integers(0, 4),
)


@given(cited=value, pool=st.lists(value, max_size=12))
def test_the_pool_finds_exactly_the_values_that_match(cited, pool):
    assert (cited in rubric.Pool(pool)) == any(cited.matches(v) for v in pool)


@given(text=st.text(max_size=400) | st.sampled_from(["1,634.8 mL " * 300, "+5.6 %" * 500, "1.0.0 mL,,5 %"]))
def test_any_model_text_grades_with_the_same_keys(text):
    for solution in (text, RUBRIC_TURN + text):
        grades = grade(solution, {**EXTRA, **ONE_CALL}, True, None)
        assert set(grades) == set(rubric.KEYS) and 0.0 <= grades["rubric"] <= 1.0
