"""`case-env bank build --env clinic`: one verl row per clinic case, split by case, in the CASE conventions.

Rows follow the common schema (`case_env.core.bank`: `agent_name` tool_agent, every clinic tool in
`tools_kwargs`, the persona's subset in `tool_selection`), with what the clinic adds: `create_kwargs.noise`
(the bank's noise configuration, which the adapter forwards so the server draws the same noise for every
sample of a group), `extra_info.clinic` (the recorded work-up and reward weights the reward function reads)
and `extra_info.noise` (the noise plan: hidden metadata for evaluation by noise type; no model reads it).
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
from case_env.envs.clinic.cases import ClinicCase
from case_env.envs.clinic.noise import NoiseConfig, plan_noise
from case_env.envs.clinic.reward import RewardWeights
from case_env.medicine.exams import catalogue_text

ABILITY = "clinic_diagnosis"


class ClinicExtra(ExtraInfo):
    clinic: dict[str, Any]
    noise: dict[str, Any]


def user_message(case: ClinicCase) -> str:
    return (
        f"A new patient is here to see you.\nDemographics: {case.demographics()}.\n"
        f"Recorded medical history: {case.history or 'none recorded'}.\n\n"
        "Talk to the patient, order the examinations you need, and give the diagnosis as "
        "<answer>condition</answer>."
    )


def system_prompt(persona: PersonaSpec) -> str:
    return persona.system_prompt + "\n\nAVAILABLE EXAMINATIONS (? = optional):\n" + catalogue_text()


def to_row(
    case: ClinicCase,
    index: int,
    split: str,
    noise: NoiseConfig,
    weights: RewardWeights,
    persona: PersonaSpec,
    tools: list[str],
    version: str,
) -> BankRow:
    plan = plan_noise(case, noise)
    workup = [e.call.key() for e in case.exams]
    extra = ClinicExtra.for_case(
        persona,
        case.case_id,
        index,
        split,
        tools,
        version,
        create={"noise": noise.model_dump()},
        question="What is the diagnosis?",
        ground_truth=case.diagnosis,
        teacher_insight=f"The diagnosis is {case.diagnosis}. The recorded work-up: "
        + "; ".join(f"{e.call.describe()}: {e.findings}" for e in case.exams),
        evidence=workup,
        clinic={"source": case.source, "exams": workup, "reward": weights.model_dump()},
        noise=plan.metadata(case),
    )
    return BankRow.chat(case.data_source, system_prompt(persona), user_message(case), ABILITY, extra)


def build(
    cases: list[ClinicCase],
    seed: int,
    fractions: tuple[float, float, float],
    noise: NoiseConfig,
    weights: RewardWeights | None = None,
) -> BankResult:
    env = registry.get("clinic")
    weights = weights or RewardWeights()
    persona = env.personas["clinician"]
    tools, version = list(env.tools), schema_version(env.tools)
    return rows_by_split(
        cases,
        fractions,
        seed,
        lambda case, index, split: to_row(case, index, split, noise, weights, persona, tools, version),
    )
