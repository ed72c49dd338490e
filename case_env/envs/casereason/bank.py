"""`case-env bank build --env casereason`: one verl row per case, in the CASE conventions.

Two modes. `independent`: the prompt alone, for verl's `single_turn_agent` (k attempts are k samples of the
GRPO group). `sequential`: the `tool_agent` loop with `submit_diagnosis`, which answers "incorrect, reconsider"
up to k - 1 times; k travels in `create_kwargs.attempts`. The clinician's reasoning statements stay in
`extra_info.casereason.statements` for reasoning recall; no model reads them.
"""

from __future__ import annotations

from typing import Any

from case_env.core import registry
from case_env.core.bank import (
    BankResult,
    BankRow,
    ExtraInfo,
    rows_by_split,
)
from case_env.core.personas import PersonaSpec
from case_env.core.tools import schema_version
from case_env.envs.casereason.cases import ReasoningCase

DATA_SOURCE = "casereason"
ABILITY = "case_diagnosis"
MODES = ("independent", "sequential")
TEMPLATE = (
    "Read the following case presentation and give the most likely diagnosis. First, provide your internal "
    "reasoning for the diagnosis within the tags <think> ... </think>. Then, output the final diagnosis (just "
    "the name of the disease/entity) within the tags <answer> ... </answer>.\n\n"
    "----------------------------------------\nCASE PRESENTATION\n----------------------------------------\n"
    "{case}\n\n"
    "----------------------------------------\nOUTPUT TEMPLATE\n----------------------------------------\n"
    "<think>\n...your internal reasoning for the diagnosis...\n</think>\n<answer>\n...the name of the "
    "disease/entity...\n</answer>"
)  # the prompt public MedCaseReasoning harnesses use (docs/sources.md, MedCaseReasoning)
SEQUENTIAL_RULE = (
    "Submit your diagnosis with submit_diagnosis before you answer; if it is incorrect, reconsider and submit a "
    "different one, up to {k} attempts in all. Then give your final diagnosis in <answer>."
)


def user_message(case: ReasoningCase, mode: str, attempts: int) -> str:
    text = TEMPLATE.format(case=case.prompt.strip())
    return text + ("\n\n" + SEQUENTIAL_RULE.format(k=attempts) if mode == "sequential" else "")


class ReasoningExtra(ExtraInfo):
    casereason: dict[str, Any]


def to_row(
    case: ReasoningCase,
    index: int,
    split: str,
    mode: str,
    attempts: int,
    persona: PersonaSpec,
    tools: list[str],
    version: str,
    extraction: tuple[str, str] = ("strict", "reference"),
) -> BankRow:
    k = attempts if mode == "sequential" else 1
    extra = ReasoningExtra.for_case(
        persona,
        case.case_id,
        index,
        split,
        tools,
        version,
        create={"attempts": k},
        tool_selection=list(persona.tools) if mode == "sequential" else [],
        question="What is the most likely diagnosis?",
        ground_truth=case.diagnosis,
        teacher_insight="\n".join(f"{i}. {s}" for i, s in enumerate(case.statements, 1))
        + f"\nFinal diagnosis: {case.diagnosis}",
        evidence=[],
        casereason={
            "mode": mode,
            "attempts": k,
            "statements": list(case.statements),
            "extraction": extraction[0],
            "eval_extraction": extraction[1],
            "pmcid": case.pmcid,
            "title": case.title,
        },
        need_tools_kwargs=mode == "sequential",
    )
    agent = "tool_agent" if mode == "sequential" else "single_turn_agent"
    return BankRow.chat(
        DATA_SOURCE, persona.system_prompt, user_message(case, mode, k), ABILITY, extra, agent
    )


def build(
    cases: list[ReasoningCase],
    seed: int,
    fractions: tuple[float, float, float],
    mode: str = "independent",
    attempts: int = 10,
    extraction: tuple[str, str] = ("strict", "reference"),
) -> BankResult:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose {' or '.join(MODES)}")
    env = registry.get("casereason")
    persona = env.personas["diagnostician"]
    tools, version = list(env.tools), schema_version(env.tools)
    return rows_by_split(
        cases,
        fractions,
        seed,
        lambda case, index, split: to_row(
            case, index, split, mode, attempts, persona, tools, version, extraction
        ),
        given=lambda case: case.split,  # MedCaseReasoning's own train/val/test stay as published
    )
