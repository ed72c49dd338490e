"""`case-env bank build --env clinic`: one verl row per clinic case, split by case, in the CASE conventions.

Besides the common schema (`case_env.core.bank`), a row holds:
- `tool_selection`: `ask_patient` and the exams offered, as MedExAgent's RL dataset offers them
  (`select_tools_for_case`: the work-up's tools plus `distractors` others, shuffled, drawn from seed and
  case, or kept from a MedExAgent parquet row); `--interface order_exam`: `ask_patient` and `order_exam`;
- the prompt and loop, by `patient`: `dialogue` (the default) is MedExAgent's RL doctor prompt as published
  (`train/rl/dataset.py` `build_doctor_system_prompt_rl`; docs/sources.md, MedExAgent) played by its loop
  (`agent_name` `medexagent`), where plain text goes to the patient; `ask_patient` is verl's `tool_agent`,
  the patient a tool, with a system and a user message and one answer format (`[DIAGNOSIS: ...]`);
- `create_kwargs.noise`: the noise configuration and, in dataset mode, this case's assignment (MedExAgent's
  draw over the whole bank, before the split), which the server realises;
- `extra_info.clinic` (the recorded work-up and the reward's rules) and `extra_info.noise` (the
  noise plan, for evaluation by noise type).
"""

from __future__ import annotations

import json
import random
from typing import Any, Literal

from case_env.core import registry
from case_env.core.bank import BankResult, BankRow, ExtraInfo, Message, RewardSpec, rows_by_split
from case_env.core.personas import PersonaSpec
from case_env.core.tools import schema_version
from case_env.envs.clinic import medexagent_noise
from case_env.envs.clinic.cases import ClinicCase
from case_env.envs.clinic.noise import NoiseConfig, plan_noise
from case_env.envs.clinic.reward import DIAGNOSIS_TAG, RewardRules
from case_env.medicine.exams import EXAMS, NOT_OFFERED, findings_sentence, read_exam_string, tool_text

ABILITY = "clinic_diagnosis"
Interface = Literal["exam_tools", "order_exam"]
PatientChannel = Literal["dialogue", "ask_patient"]
EmptyCells = Literal["as_read", "omit"]
ASK = "ask_patient"
LOOP = "medexagent"  # the agent loop a dialogue row names (case_env.envs.clinic.agent_loop)
ASK_LOOP = "tool_agent"  # verl's stock loop, for rows whose patient is a tool


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


def _listing(exams: list[str], interface: Interface) -> str:
    """The offered exams as the prompt lists them; with `order_exam`, the whole vocabulary."""
    return tool_text(exams) if interface == "exam_tools" else tool_text(list(EXAMS))


def _example(interface: Interface) -> str:
    if interface == "exam_tools":
        return (
            '<tool_call>\n{"name": "ct", "arguments": {"region": "chest", "contrast": "yes"}}\n</tool_call>'
        )
    return (
        '<tool_call>\n{"name": "order_exam", "arguments": {"exam": "ct", "region": "chest", "contrast": "yes"}}'
        "\n</tool_call>"
    )


def medexagent_prompt(
    case: ClinicCase, exams: list[str], interface: Interface, blank: str | None = None
) -> str:
    """MedExAgent's RL doctor prompt, as `build_doctor_system_prompt_rl` (`train/rl/dataset.py`, e5b0699) writes
    it, empty fields as `blank` (the case's own by default: "nan" from a case table, as pandas gives them it);
    with `order_exam`, the one tool and its example instead of one tool per exam."""
    listing = _listing(exams, interface)
    call = '<tool_call>\n{"name": "<tool_name>", "arguments": {"<param>": "<value>", ...}}\n</tool_call>'
    empty = '<tool_call>\n{"name": "<tool_name>", "arguments": {}}\n</tool_call>'
    return f"""You are an experienced physician conducting a medical consultation. Your goal is to gather information from the patient, order appropriate examinations, interpret results, and arrive at a diagnosis.

PATIENT DEMOGRAPHICS:
{case.demographic_lines(blank)}

PATIENT'S MEDICAL HISTORY:
{case.history_text(blank)}

AVAILABLE EXAMINATIONS:
{listing}

TOOL CALL FORMAT:
To order an examination, include a tool call in your message using the following format:
{call}

For tools with no required parameters, use an empty arguments object:
{empty}

You may include a brief message to the patient before the tool call. For example, to order a chest CT with contrast, you would write:

Based on your symptoms, I'd like to order a CT scan of your chest to get a better look.
{_example(interface)}

You MUST use only the allowed values listed for each parameter above. Do NOT invent new parameter values.

CONSULTATION STRUCTURE:
1. GREETING: Greet the patient and ask the patient what brings them in today.
2. SYMPTOM INQUIRY: Ask about the patient's symptoms, their onset, duration, severity, and any associated factors. Keep this phase brief (3-5 questions) and ask at most 1-2 short questions per turn. Once you have enough information, move on to examinations.
3. EXAMINATIONS: Based on your clinical assessment, order appropriate examinations one at a time using the <tool_call> format. Order only exams that are clinically indicated — avoid unnecessary tests. After each exam result comes back, briefly discuss the findings with the patient (2-3 sentences) and explain why you'd like to order the next examination before ordering it.
4. DIAGNOSIS: After receiving exam results, state your final diagnosis using the exact format: [DIAGNOSIS: <your diagnosis>]

INSTRUCTIONS:
- Only output what you would say directly to the patient. Do NOT include your internal thoughts / reasoning / plan.
- Pace gently and do NOT overwhelm the patient with too many questions at once.
- Ask at most 1-2 short questions per turn.
- Order exams one at a time, do NOT order multiple exams in one turn.
- After receiving exam results, always discuss the findings before ordering the next exam.
- You MUST end with [DIAGNOSIS: ...] to conclude the consultation.
"""


def ask_patient_prompt(case: ClinicCase, persona: PersonaSpec, exams: list[str], interface: Interface) -> str:
    """The prompt of the `ask_patient` channel: MedExAgent's sections, with the patient reached through the
    tool, since a reply without a tool call ends verl's `tool_agent` episode."""
    listing = _listing(exams, interface)
    how = "call its tool, for example" if interface == "exam_tools" else "use order_exam, for example"
    return f"""{persona.system_prompt}

PATIENT DEMOGRAPHICS:
{case.demographic_lines("")}

PATIENT'S MEDICAL HISTORY:
{case.history_text("")}

AVAILABLE EXAMINATIONS:
{listing}
TOOL CALL FORMAT:
To speak to the patient, call ask_patient with what you would say. To order an examination, {how} a chest CT
with contrast:
{_example(interface)}
For tools without required parameters, use an empty arguments object. Use only the allowed values listed for
each parameter.

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
    rules: RewardRules,
    persona: PersonaSpec,
    tools: list[str],
    version: str,
    selection: list[str],
    interface: Interface,
    patient: PatientChannel = "dialogue",
    empty_cells: EmptyCells = "as_read",
) -> BankRow:
    plan = plan_noise(case, noise)
    # what MedExAgent scores against: its exam map for a case table or parquet, the gold calls for an eval file
    spelled = list(case.gold) or [e.spelled or e.call.key() for e in case.exams]
    exams = [t for t in selection if t in EXAMS]
    if patient == ASK:
        system = ask_patient_prompt(case, persona, exams, interface)
        prompt = [Message(role="system", content=system), Message(role="user", content=user_message(case))]
    else:
        blank = None if empty_cells == "as_read" else ""
        prompt = [Message(role="system", content=medexagent_prompt(case, exams, interface, blank))]
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
            "patient": patient,
            "reward": rules.model_dump(),
            "prefix": diagnosis_prefix(case, [m.model_dump() for m in prompt]),
        },
        noise=plan.metadata(case),
    )
    return BankRow(
        data_source=case.data_source,
        prompt=prompt,
        ability=ABILITY,
        extra_info=extra,
        agent_name=ASK_LOOP if patient == ASK else LOOP,
        reward_model=RewardSpec(ground_truth=case.diagnosis),
    )


GREETING = "Hello, what brings you in today?"


def diagnosis_prefix(case: ClinicCase, prompt: list[dict]) -> list[dict]:
    """What MedExAgent's diagnosis protocol gives the model before it diagnoses (`evaluation/data.py`
    `prepare_diagnosis_eval_samples`): the case's recorded conversation cut before its last turn that names a
    diagnosis; a case without one (a case table's row) gets the consultation its record implies, clean: the
    row's prompt, a greeting, the patient's complaint as recorded, and each exam of the work-up called and
    answered in MedExAgent's result sentence."""
    said = [
        i
        for i, m in enumerate(case.conversation)
        if m.get("role") == "assistant" and DIAGNOSIS_TAG.search(str(m.get("content") or ""))
    ]
    if said and said[-1] > 0:
        return [dict(m) for m in case.conversation[: said[-1]]]
    messages = [
        *prompt,
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": case.symptoms},
    ]
    for n, exam in enumerate(case.exams):
        call_id = f"gold_{n}"
        arguments = read_exam_string(exam.spelled)[1] if exam.spelled else dict(exam.call.params)
        function = {"name": exam.call.name, "arguments": json.dumps(arguments)}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        sentence = findings_sentence(exam.call.name, arguments, exam.findings)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": sentence})
    return messages


def build(
    cases: list[ClinicCase],
    seed: int,
    fractions: tuple[float, float, float],
    noise: NoiseConfig,
    rules: RewardRules | None = None,
    distractors: int = 5,
    interface: Interface = "exam_tools",
    patient: PatientChannel = "dialogue",
    empty_cells: EmptyCells = "as_read",
) -> BankResult:
    env = registry.get("clinic")
    rules = rules or RewardRules()
    persona = env.personas["clinician"]
    tools, version = list(env.tools), schema_version(env.tools)
    noises = assign_noise(cases, noise)

    def selection(case: ClinicCase) -> list[str]:
        exams = ["order_exam"] if interface == "order_exam" else offered_exams(case, seed, distractors)
        return [ASK, *exams] if patient == ASK else exams  # in a dialogue the patient hears plain text

    return rows_by_split(
        cases,
        fractions,
        seed,
        lambda case, index, split: to_row(
            case,
            index,
            split,
            noises[case.case_id],
            rules,
            persona,
            tools,
            version,
            selection(case),
            interface,
            patient,
            empty_cells,
        ),
        given=lambda case: (
            case.split
        ),  # MedExAgent's own files (train_patients.csv, *_test_*.jsonl) stay apart
    )
