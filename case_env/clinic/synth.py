"""`case-env synth --env clinic`: synthetic clinic cases in MedExAgent's CSV format (and its eval JSONL).

Cases are drawn from the condition table (`case_env.clinic.conditions`), balanced over conditions, with
every choice a FrozenDraw of (seed, case index), so a file is the same on any machine. About a third of
the cases carry their condition's telling symptom; the others show only what the condition shares with its
presenting problem, described in words that often belong to another condition of that problem, so
that an agent must examine. The written file reads back through the same loader as
real data (`case_env.clinic.cases`): the tests check that round trip.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from case_env.clinic.cases import MAX_EXAMS, ClinicCase, RecordedExam, persona_of
from case_env.clinic.catalogue import parse_exam_string
from case_env.clinic.conditions import CONDITIONS, FAMILIES, Condition
from case_env.synth.frozen import FrozenDraw

CSV_EXAMS = 9  # MedExAgent's filter drops rows reaching exam10
CSV_COLUMNS = ["age", "gender", "race", "additional_demographics", "medical_history", "diagnosis",
               "self_reported_symptoms",
               *(f"exam{i}" for i in range(1, MAX_EXAMS + 1)),
               *(f"exam{i}_findings" for i in range(1, MAX_EXAMS + 1)), "source"]  # fmt: skip
SEVERITIES = ("mild", "moderate", "severe", "terrible")
RACES = ("White", "Black", "Asian", "Hispanic", "mixed")
TYPICAL = 0.2  # share of cases told with the condition's own descriptor (and, apart, time course)
SPECIFIC = 0.25  # share of cases that mention their condition's telling symptom
GENERIC_HISTORY = ("no known allergies", "appendix removed as a child", "takes no regular medicines",
                   "a broken wrist years ago")  # fmt: skip


def _symptoms(condition: Condition, draw: FrozenDraw) -> str:
    """Some of the time the complaint has the condition's own descriptor and time course, else those of
    another condition of its family: patients describe the same disease in different words."""
    family = FAMILIES[condition.family]
    kin = sorted((c for c in CONDITIONS.values() if c.family == condition.family), key=lambda c: c.name)
    descriptor = (
        condition.descriptor if draw.chance("typical", TYPICAL) else draw.choice("like", kin).descriptor
    )
    complaint = family.complaint.format(
        severity=draw.choice("severity", SEVERITIES), descriptor=descriptor, part=family.part
    )
    timing = condition if draw.chance("typical_time", TYPICAL) else draw.choice("like_time", kin)
    low, high, unit = timing.duration
    amount = draw.integer("duration", low, high)
    unit = unit[:-1] if amount == 1 else unit
    sentences = [complaint, f"It started {amount} {unit} ago"]
    sentences += [shared for i, shared in enumerate(family.shared) if draw.chance(f"shared{i}", 0.5)]
    if draw.chance("specific", SPECIFIC):
        sentences += list(condition.symptoms)
    return ". ".join(s[0].upper() + s[1:] for s in sentences) + "."


def _exams(condition: Condition, draw: FrozenDraw) -> tuple[RecordedExam, ...]:
    family = FAMILIES[condition.family]
    recorded = dict(condition.findings)
    routine = [e for e in draw.shuffled("workup", list(family.workup)) if e not in recorded]
    for exam in routine[: draw.integer("routine", 1, 2)]:
        recorded[exam] = family.workup[exam]
    order = draw.shuffled("order", list(recorded))[:CSV_EXAMS]
    return tuple(RecordedExam(parse_exam_string(e), recorded[e]) for e in order)


def make_case(index: int, seed: int, stem: str = "clinic_synthetic") -> ClinicCase:
    names = sorted(CONDITIONS)
    draw = FrozenDraw(seed, f"clinic/{index}")
    rounds = FrozenDraw(seed, "clinic/rounds")  # each round of len(names) cases holds every condition once
    condition = CONDITIONS[rounds.shuffled(str(index // len(names)), names)[index % len(names)]]
    sex = condition.sex if condition.sex != "any" else draw.choice("sex", ("M", "F"))
    history = [h for h in condition.history if draw.chance(f"history:{h}", 0.4)]
    history += [draw.choice("generic", GENERIC_HISTORY)] if draw.chance("has_generic", 0.5) else []
    return ClinicCase(
        case_id=f"{stem}-{index:05d}",
        source="synthetic",
        diagnosis=condition.name,
        symptoms=_symptoms(condition, draw),
        age=str(draw.integer("age", *condition.ages)),
        gender=sex,
        race=draw.choice("race", RACES),
        history="; ".join(history) if history else "no significant past medical history",
        exams=_exams(condition, draw),
    )


def make_cases(n: int, seed: int, stem: str = "clinic_synthetic") -> list[ClinicCase]:
    return [make_case(i, seed, stem) for i in range(n)]


def write_csv(cases: list[ClinicCase], path: Path) -> None:
    """MedExAgent's RL case table. The CSV has no persona column; the simulator draws one per case id."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, CSV_COLUMNS)
        writer.writeheader()
        for case in cases:
            row = {"age": case.age, "gender": case.gender, "race": case.race,
                   "additional_demographics": case.other_demographics, "medical_history": case.history,
                   "diagnosis": case.diagnosis, "self_reported_symptoms": case.symptoms, "source": case.source}  # fmt: skip
            for i, exam in enumerate(case.exams, start=1):
                row[f"exam{i}"], row[f"exam{i}_findings"] = exam.call.key(), exam.findings
            writer.writerow(row)


def write_jsonl(cases: list[ClinicCase], path: Path) -> None:
    """MedExAgent's evaluation format: one patient per line, exams as tool calls in a conversation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for n, case in enumerate(cases):
            conversation: list[dict] = [
                {"role": "assistant", "content": "Hello, what brings you in today?"},
                {"role": "user", "content": case.symptoms},
            ]
            for i, exam in enumerate(case.exams):
                call_id = f"call_{i}"
                arguments = json.dumps(dict(exam.call.params))
                conversation.append({"role": "assistant", "content": "", "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": exam.call.name, "arguments": arguments}}]})  # fmt: skip
                conversation.append({"role": "tool", "tool_call_id": call_id, "content": exam.findings})
            conversation.append({"role": "assistant", "content": f"[DIAGNOSIS: {case.diagnosis}]"})
            persona = persona_of(case)
            record = {
                "patient_id": case.case_id.rsplit("-", 1)[-1] if case.case_id.rsplit("-", 1)[-1].isdigit() else n,
                "diagnosis": case.diagnosis,
                "demographics": {"age": case.age, "gender": case.gender, "race": case.race,
                                 "additional_demographics": case.other_demographics},
                "medical_history": case.history,
                "self_reported_symptoms": case.symptoms,
                "patient_persona": {"personality": {"key": persona.personality},
                                    "language_proficiency": {"key": persona.language},
                                    "recall": {"key": persona.recall}},
                "conversation": conversation,
                "source": case.source,
            }  # fmt: skip
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
