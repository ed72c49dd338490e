"""The clinic reward: a pure function of (trajectory text, ground truth, extra_info), components apart. Two
profiles, chosen per bank (`extra_info.clinic.reward.profile`):

- **`medexagent`** (the default): MedExAgent's RL reward as published (`train/rl/reward.py`,
  `config/rl_config.yaml`; docs/sources.md, MedExAgent), `score = 1.0 · dx + 0.5 · tool_match − 0.1 · cost −
  0.0 · format` (`medexagent_reward`): its weights are the components' defaults (`COMPONENTS`), which a row's
  `extra_info.reward_weights` may change, `exam_score` being `tool_match` under this profile. Every exam the
  model called counts as called, refused or not, as its executor records them: the calls that reached the
  server (verl's `tool_extra_fields`) and those read from the model's text that never did (a tool the row
  does not offer; a second call in a turn).
- **`strict`** (ours): an exam counts only if it ran, wrong parameters earn half, and every order costs
  (cost + discomfort) / 6, a work-up exam discounted 75 % the first time: under MedExAgent's rule a work-up
  exam is free however often it is repeated, and any other costs at most 0.1.

The diagnosis is the first `[DIAGNOSIS: ...]` after the last tool response, else the last `<answer>` there,
so no tool output can answer. Its score is the Jaccard of matched conditions, by MedExAgent's judge prompt
when `CASE_ENV_JUDGE_URL` is set (at its temperature 0.7, sampled anew per rollout unless `judge_cache`), else
by the deterministic matcher (`case_env.medicine.diagnosis`). `acc` is strict accuracy (every condition
matched), `acc_lenient` at least one, as MedExAgent's evaluation reports them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from case_env.core import registry
from case_env.core.answers import ANSWER_TAG, TOOL_RESPONSE, final_segment, last_answer
from case_env.core.calls import (
    TOOL_CALL,
    Call,
    ScoreExtra,
    decoded,
    executed_calls,
    written_calls,
)
from case_env.core.environment import Component, row_weights, weighted
from case_env.core.llm import Asker, asked_judge, fell_back
from case_env.core.tags import Tagged
from case_env.envs.clinic import medexagent_reward as mx
from case_env.medicine.diagnosis import MAX_CONDITIONS, Verdict, conditions, judge, looks_injected
from case_env.medicine.exams import ExamCall, ExamError, exam_call, loaded_exam, read_exam_string

# MedExAgent's tag, as `\[DIAGNOSIS:\s*(.+?)\]` (any case) reads it, found in linear time (core/tags.py)
DIAGNOSIS_TAG = Tagged("[DIAGNOSIS:", "]", ignore_case=True, skip_space=True, nonempty=True)
ASK = "ask_patient"
ORDER = "order_exam"
# MedExAgent's weights (config/rl_config.yaml: w_diagnosis, w_tool_match, w_cost, w_format), the last two
# penalties
COMPONENTS = (
    Component("dx", 1.0, "the diagnosis: the Jaccard of the conditions matched (w_diagnosis)"),
    Component(
        "exam_score",
        0.5,
        "the exams: MedExAgent's tool match, or under strict their appropriateness (w_tool_match)",
    ),
    Component("cost", -0.1, "a penalty: the unnecessary exams' cost, or under strict every order's (w_cost)"),
    Component(
        "format", 0.0, "a penalty: MedExAgent's for turns without a tool call (w_format, 0 in its config)"
    ),
)
KEYS = (
    "score",
    "acc",
    "acc_lenient",
    "dx",
    "exam_score",
    "tool_match",
    "cost",
    "format",
    "tool_cost_total",
    "tool_cost_unnecessary",
    "tool_cost_ground_truth",
    "exams",
    "exams_necessary",
    "hallucinated",
    "asks",
    "pred",
    "format_ok",
    "judge",
    "judge_fallback",
    "profile",
)


class RewardRules(BaseModel):
    """A bank's reward rules: the profile and its settings (MedExAgent's RL config by default); the weights
    are the components' (`COMPONENTS`, `extra_info.reward_weights`)."""

    model_config = ConfigDict(extra="ignore", strict=True)  # as /openapi.json says: "1.0" is not a number

    profile: Literal["medexagent", "strict"] = Field("medexagent", description="Which rule scores exams.")
    uniform_cost: bool = Field(
        False, description="medexagent: every unnecessary exam costs 1 (its ablation)."
    )
    necessary_discount: float = Field(
        0.75, ge=0, le=1, description="strict: share of a work-up exam's charge waived, first order only."
    )
    judge_temperature: float = Field(mx.JUDGE_TEMPERATURE, ge=0, le=2, description="The judge's temperature.")
    judge_cache: bool = Field(
        False,
        description="Keep one judge sample per (prediction, truth), so the reward is a function of the "
        "trajectory; MedExAgent asks its judge afresh for every rollout (the default).",
    )


class ClinicRecord(BaseModel):
    """`extra_info.clinic` as the reward reads it: the bank's reward and the case's work-up (exam strings)."""

    model_config = ConfigDict(extra="allow", strict=True)

    reward: RewardRules = Field(default_factory=RewardRules)
    exams: list[str] = Field(default_factory=list)


class ClinicScoreExtra(ScoreExtra):
    clinic: Annotated[ClinicRecord | None, BeforeValidator(decoded)] = (
        None  # a JSON string in MedExAgent's parquet
    )
    tool_selection: list[str] | None = Field(None, description="The tools the row offers (its work-up).")


def as_tool(name: str, arguments: dict) -> mx.Tool:
    """A call as MedExAgent's executor records it; an `order_exam` call becomes the exam it names."""
    arguments = dict(arguments) if isinstance(arguments, dict) else {}
    if name == ORDER:
        exam = str(arguments.pop("exam", ""))
        return exam, {k: v for k, v in arguments.items() if v is not None}
    return name, arguments


def written_turns(solution_str: str) -> list[tuple[int, list[mx.Tool]]]:
    """Per assistant turn (the text between tool responses): how many calls it wrote, and those readable."""
    schemas = registry.tool_parameters()
    return [
        (len(TOOL_CALL.findall(turn)), written_calls(turn, schemas))
        for turn in TOOL_RESPONSE.split(solution_str or "")
    ]


def ordered_tools(turns: list[tuple[int, list[mx.Tool]]], recorded: Sequence[Call] | None) -> list[mx.Tool]:
    """Every exam call of the episode, as called. The recorded calls (they ran, refused or not) are a
    subsequence of the calls the model wrote; a written call without a record never reached the server
    (verl refused a tool the row does not offer, or ran only the first call of a turn) and is added as
    written, since MedExAgent's executor records every call."""
    written = [(n, a) for _, calls in turns for n, a in calls if n != ASK]
    if recorded is None:
        return [as_tool(n, a) for n, a in written]
    ran = [c for c in recorded if c.tool != ASK]
    tools = [as_tool(c.tool, c.arguments) for c in ran]
    at = 0
    for name, arguments in written:
        if at < len(ran) and (ran[at].tool, ran[at].arguments) == (name, arguments):
            at += 1
        else:
            tools.append(as_tool(name, arguments))
    return tools


def tool_turns(turns: list[tuple[int, list[mx.Tool]]]) -> tuple[int, int]:
    """(tool-call turns, turns with a format error): a turn that calls an exam, and errs when it holds more
    than one call besides questions to the patient or a call that cannot be read."""
    attempts = errors = 0
    for written, parsed in turns:
        exams = written - sum(1 for n, _ in parsed if n == ASK)
        if exams <= 0:
            continue
        attempts += 1
        errors += exams > 1 or len(parsed) < written
    return attempts, errors


def workup(exams: list[str]) -> list[tuple[ExamCall, mx.Tool]]:
    """The recorded work-up as the row lists it, each exam as written with its canonical call: every exam
    MedExAgent's loader keeps (`loaded_exam`: `other`, values outside the allowed lists, missing parameters).
    A bank lists what MedExAgent scores against: its RL exam map (one entry per exam string) for a case table
    or a verl parquet, every gold call of the conversation for an evaluation file."""
    found = []
    for spelled in exams:
        try:
            found.append((loaded_exam(spelled, "")[0].call, read_exam_string(spelled)))
        except ExamError:
            continue
    return found


def read_diagnosis(solution_str: str) -> str | None:
    tail = final_segment(solution_str or "")
    tag = DIAGNOSIS_TAG.search(tail)
    if tag is not None:
        return tag.group(1).strip()
    answer = last_answer(tail, (ANSWER_TAG,))
    return answer.strip() if answer is not None else None


async def diagnosis_verdict(
    prediction: str | None, truth: str, reward: RewardRules, client: Asker | None
) -> Verdict:
    truth_conditions = conditions(truth)
    if not prediction:
        return Verdict(len(truth_conditions), 0, 0, "none")
    predicted = conditions(prediction) or [prediction]
    if reward.profile == "strict" and len(predicted) > MAX_CONDITIONS:
        return Verdict(len(truth_conditions), 0, 0, "none")  # a shotgun is no diagnosis under strict
    if reward.profile == "strict" or client is None:
        return await judge(predicted, truth_conditions, client)
    rules = await judge(predicted, truth_conditions, None)
    if looks_injected(prediction):
        return Verdict(rules.truth, rules.predicted, rules.matched, "refused")
    prompt = mx.JUDGE_PROMPT.format(ground_truth=truth, prediction=prediction)
    reply = await client.acomplete(
        [{"role": "user", "content": prompt}],
        temperature=reward.judge_temperature,
        fresh=not reward.judge_cache,
    )
    if reply is None:
        return Verdict(rules.truth, rules.predicted, rules.matched, "unavailable")
    return Verdict(*mx.parse_judge(reply.text), "judge")


def _strict_exams(tools: list[mx.Tool]) -> list[ExamCall]:
    exams = []
    for name, arguments in tools:
        try:
            exams.append(exam_call(name, {k: v for k, v in arguments.items() if isinstance(v, str)}))
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
    return credit / union if union > 0 else 0.0


def strict_cost(ordered: list[ExamCall], necessary: list[ExamCall], discount: float) -> float:
    remaining = Counter(necessary)
    total = 0.0
    for exam in ordered:
        charge = exam.exam.charge / 6
        if remaining[exam] > 0:
            remaining[exam] -= 1
            charge *= 1 - discount
        total += charge
    return total


async def clinic_score(
    solution_str: str,
    ground_truth: str,
    extra_info: ScoreExtra | Mapping | None = None,
    client: Asker | None = None,
) -> dict[str, Any]:
    extra = ClinicScoreExtra.read(extra_info)
    record = extra.clinic or ClinicRecord()
    rules = record.reward
    recorded = workup(record.exams)
    truth = [tool for _, tool in recorded]
    prediction = read_diagnosis(solution_str)
    verdict = await diagnosis_verdict(prediction, str(ground_truth or ""), rules, client or asked_judge())
    dx = verdict.jaccard
    turns = written_turns(solution_str)
    fmt = mx.format_penalty(*tool_turns(turns))
    calls = executed_calls(solution_str, extra.case_env_tool_calls, registry.tool_parameters)
    if rules.profile == "medexagent":
        tools = ordered_tools(turns, extra.case_env_tool_calls)
        tool_match = exam_term = mx.tool_match(tools, truth)
        cost = mx.cost_penalty(tools, truth, rules.uniform_cost)
        exams = len(tools)
    else:
        tools = [as_tool(c.tool, c.arguments) for c in calls if c.ok and c.tool != ASK]
        ordered = _strict_exams(tools)
        necessary = [call for call, _ in recorded]
        exam_term = appropriateness(ordered, necessary)
        tool_match = mx.tool_match(tools, truth)
        cost = strict_cost(ordered, necessary, rules.necessary_discount)
        exams = len(ordered)
    values = {"dx": dx, "exam_score": exam_term, "cost": cost, "format": fmt}
    score = weighted(COMPONENTS, values, row_weights(COMPONENTS, extra.reward_weights))
    # MedExAgent's evaluation counts a call of a tool outside the case's list as hallucinated
    offered = set(extra.tool_selection or ())
    hallucinated = 0 if not offered or ORDER in offered else sum(1 for n, _ in tools if n not in offered)
    asks = sum(1 for c in calls if c.tool == ASK and c.ok)
    return {
        "score": score,
        "acc": float(verdict.strict),
        "acc_lenient": float(verdict.lenient),
        "dx": dx,
        "exam_score": exam_term,
        "tool_match": tool_match,
        "cost": cost,
        "format": fmt,
        **mx.cost_totals(tools, truth),
        "exams": exams,
        "exams_necessary": len(truth),
        "hallucinated": hallucinated,
        "asks": asks,
        "pred": prediction or "",
        "format_ok": verdict.predicted > 0,
        "judge": verdict.judge,
        "judge_fallback": fell_back(verdict.judge),
        "profile": rules.profile,
    }
