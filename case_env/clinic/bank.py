"""`case-env bank build --env clinic`: one verl row per clinic case, split by case, in the CASE conventions.

Rows follow the imaging bank's schema (same columns, `agent_name` tool_agent, every tool in `tools_kwargs`,
the persona's subset in `tool_selection`), with what the clinic adds: `create_kwargs.noise` (the bank's noise
configuration, which the adapter forwards so the server draws the same noise for every sample of a group),
`extra_info.clinic` (the recorded work-up and reward weights the reward function reads) and
`extra_info.noise` (the noise plan: hidden metadata for evaluation by noise type; no model reads it).
"""

from __future__ import annotations

import json

from case_env.bank.build import BankResult, rows_by_split
from case_env.clinic.cases import ClinicCase
from case_env.clinic.catalogue import catalogue_text
from case_env.clinic.noise import NoiseConfig, plan_noise
from case_env.clinic.reward import RewardWeights
from case_env.personas import personas
from case_env.tooling import Persona, load_tools, schema_version

ABILITY = "clinic_diagnosis"


def user_message(case: ClinicCase) -> str:
    return (f"A new patient is here to see you.\nDemographics: {case.demographics()}.\n"
            f"Recorded medical history: {case.history or 'none recorded'}.\n\n"
            "Talk to the patient, order the examinations you need, and give the diagnosis as "
            "<answer>condition</answer>.")  # fmt: skip


def system_prompt() -> str:
    return (
        personas()[Persona.CLINICIAN].system_prompt
        + "\n\nAVAILABLE EXAMINATIONS (? = optional):\n"
        + (catalogue_text())
    )


def to_row(case: ClinicCase, index: int, split: str, noise: NoiseConfig, weights: RewardWeights,
           version: str) -> dict:  # fmt: skip
    plan = plan_noise(case, noise)
    create = {"patient_id": case.case_id, "noise": noise.model_dump()}
    workup = [e.call.key() for e in case.exams]
    extra = {
        "index": index,
        "split": split,
        "patient_id": case.case_id,
        "question_idx": index,
        "question": "What is the diagnosis?",
        "ground_truth": case.diagnosis,
        "tools_kwargs": {name: {"create_kwargs": create} for name in load_tools()},
        "tool_selection": personas()[Persona.CLINICIAN].tools,
        "teacher_insight": f"The diagnosis is {case.diagnosis}. The recorded work-up: "
        + "; ".join(f"{e.call.describe()}: {e.findings}" for e in case.exams),
        "evidence": workup,
        "clinic": {"source": case.source, "exams": workup, "reward": weights.model_dump()},
        "noise": plan.metadata(case),
        "need_tools_kwargs": True,
        "tool_schema_version": version,
    }
    return {
        "data_source": case.data_source,
        "prompt": [{"role": "system", "content": system_prompt()}, {"role": "user", "content": user_message(case)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": case.diagnosis},
        "extra_info": json.dumps(extra, ensure_ascii=False),
        "agent_name": "tool_agent",
    }  # fmt: skip


def build(cases: list[ClinicCase], seed: int, fractions: tuple[float, float, float], noise: NoiseConfig,
          weights: RewardWeights | None = None) -> BankResult:  # fmt: skip
    weights = weights or RewardWeights()
    version = schema_version(load_tools())
    return rows_by_split(cases, fractions, seed, lambda case, index, split: to_row(case, index, split, noise, weights,
                                                                                   version))  # fmt: skip
