"""`case-env bank build --env clinic`: one verl row per clinic case, split by case, in the CASE conventions.

Rows follow the common schema (`case_env.core.bank`: `agent_name` tool_agent, every clinic tool in
`tools_kwargs`), with what the clinic adds:

- `tool_selection`: `ask_patient` and the exams the case is offered, as MedExAgent's RL dataset offers them
  (`select_tools_for_case`): the work-up's tools (each name once, never `other`) plus `distractors` other
  exam tools, shuffled; drawn from (seed, case id), or kept from a MedExAgent parquet row. With
  `--interface order_exam`, `ask_patient` and `order_exam` instead.
- the prompt: MedExAgent's RL doctor prompt in substance (demographics, history, the offered examinations
  with their allowed values, the tool-call format, its consultation structure, `[DIAGNOSIS: ...]`), with one
  change verl forces: the doctor speaks to the patient through `ask_patient`, since a reply without a tool
  call ends verl's episode.
- `create_kwargs.noise`: the noise configuration and, in dataset mode, this case's assignment (MedExAgent's
  dataset-level draw over the whole bank, before the split), which the server realises;
- `extra_info.clinic` (the recorded work-up, as written, and the reward profile and weights the reward
  reads) and `extra_info.noise` (the noise plan: hidden metadata for evaluation by noise type).
"""

from __future__ import annotations

import random
from typing import Any, Literal

from case_env.core import registry
from case_env.core.bank import BankResult, BankRow, ExtraInfo, rows_by_split
from case_env.core.personas import PersonaSpec
from case_env.core.tools import schema_version
from case_env.envs.clinic import medexagent_noise
from case_env.envs.clinic.cases import ClinicCase
from case_env.envs.clinic.noise import NoiseConfig, plan_noise
from case_env.envs.clinic.reward import RewardWeights
from case_env.medicine.exams import EXAMS, NOT_OFFERED, tool_text

ABILITY = "clinic_diagnosis"
Interface = Literal["exam_tools", "order_exam"]


class ClinicExtra(ExtraInfo):
    clinic: dict[str, Any]
    noise: dict[str, Any]


def offered_exams(case: ClinicCase, seed: int, distractors: int) -> list[str]:
    """The case's work-up tools plus `distractors` others, shuffled (MedExAgent's select_tools_for_case)."""
    if case.offered is not None:
        return [t for t in case.offered if t in EXAMS]
    truth = list(dict.fromkeys(e.call.name for e in case.exams if e.call.name not in NOT_OFFERED))
    pool = [name for name in EXAMS if name not in truth and name not in NOT_OFFERED]
    rng = random.Random(f"{seed}/clinic/tools/{case.case_id}")
    chosen = truth + rng.sample(pool, min(distractors, len(pool)))
    rng.shuffle(chosen)
    return chosen


def system_prompt(case: ClinicCase, persona: PersonaSpec, exams: list[str], interface: Interface) -> str:
    listing = tool_text(exams) if interface == "exam_tools" else tool_text(list(EXAMS))
    how = (
        'To order an examination, call its tool, for example a chest CT with contrast:\n<tool_call>\n{"name": '
        '"ct", "arguments": {"region": "chest", "contrast": "yes"}}\n</tool_call>\nFor tools without required '
        "parameters, use an empty arguments object."
        if interface == "exam_tools"
        else 'Order an examination with order_exam, for example:\n<tool_call>\n{"name": "order_exam", '
        '"arguments": {"exam": "ct", "region": "chest", "contrast": "yes"}}\n</tool_call>'
    )
    return f"""{persona.system_prompt}

PATIENT DEMOGRAPHICS:
{case.demographics()}

PATIENT'S MEDICAL HISTORY:
{case.history or "No known past medical history."}

AVAILABLE EXAMINATIONS:
{listing}
TOOL CALL FORMAT:
To speak to the patient, call ask_patient with what you would say. {how}
Use only the allowed values listed for each parameter.

CONSULTATION STRUCTURE:
1. GREETING: greet the patient and ask what brings them in today.
2. SYMPTOM INQUIRY: ask about onset, duration, severity and associated factors, 1-2 short questions per turn,
3-5 questions in all.
3. EXAMINATIONS: order clinically indicated exams one at a time and avoid unnecessary tests.
4. DIAGNOSIS: give the final diagnosis in exactly this format: [DIAGNOSIS: <your diagnosis>]"""


def user_message(case: ClinicCase) -> str:
    return "A new patient is here to see you. Begin the consultation."


def assign_noise(cases: list[ClinicCase], noise: NoiseConfig) -> dict[str, NoiseConfig]:
    """Each case's noise configuration: in dataset mode with its share of MedExAgent's dataset-wide draw (a
    case that arrived with an assignment keeps it)."""
    if noise.mode != "dataset":
        return {c.case_id: noise for c in cases}
    drawn = medexagent_noise.assign(
        [c.symptoms for c in cases],
        [[e.findings for e in c.exams] for c in cases],
        noise.patient_rate,
        noise.exam_rate,
        noise.seed,
    )
    out = {}
    for i, case in enumerate(cases):
        if case.noise is not None:
            out[case.case_id] = noise.assigned(case.noise.patient, dict(case.noise.exams))
        else:
            out[case.case_id] = noise.assigned(drawn.patient.get(i, ()), drawn.exams.get(i, {}))
    return out


def to_row(
    case: ClinicCase,
    index: int,
    split: str,
    noise: NoiseConfig,
    weights: RewardWeights,
    persona: PersonaSpec,
    tools: list[str],
    version: str,
    selection: list[str],
    interface: Interface,
) -> BankRow:
    plan = plan_noise(case, noise)
    spelled = [e.spelled or e.call.key() for e in case.exams]
    exams = [t for t in selection if t in EXAMS]
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
        evidence=[e.call.key() for e in case.exams],
        tool_selection=selection,
        clinic={
            "source": case.source,
            "exams": spelled,
            "interface": interface,
            "reward": weights.model_dump(),
        },
        noise=plan.metadata(case),
    )
    prompt = system_prompt(case, persona, exams, interface)
    return BankRow.chat(case.data_source, prompt, user_message(case), ABILITY, extra)


def build(
    cases: list[ClinicCase],
    seed: int,
    fractions: tuple[float, float, float],
    noise: NoiseConfig,
    weights: RewardWeights | None = None,
    distractors: int = 5,
    interface: Interface = "exam_tools",
) -> BankResult:
    env = registry.get("clinic")
    weights = weights or RewardWeights()
    persona = env.personas["clinician"]
    tools, version = list(env.tools), schema_version(env.tools)
    noises = assign_noise(cases, noise)

    def selection(case: ClinicCase) -> list[str]:
        if interface == "order_exam":
            return ["ask_patient", "order_exam"]
        return ["ask_patient", *offered_exams(case, seed, distractors)]

    return rows_by_split(
        cases,
        fractions,
        seed,
        lambda case, index, split: to_row(
            case,
            index,
            split,
            noises[case.case_id],
            weights,
            persona,
            tools,
            version,
            selection(case),
            interface,
        ),
    )
