"""`case-env synth --env clinic`: synthetic clinic cases in MedExAgent's CSV format (and its eval JSONL).

Each case is a synthetic presentation (`case_env.medicine.presentations`) told by a clinic patient. The
written file reads back through the same loader as real data (`case_env.envs.clinic.cases`): the tests check
that round trip.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from case_env.envs.clinic.cases import MAX_EXAMS, ClinicCase, medexagent_persona, persona_of
from case_env.medicine.presentations import make_presentation

CSV_COLUMNS = [
    "age",
    "gender",
    "race",
    "additional_demographics",
    "medical_history",
    "diagnosis",
    "self_reported_symptoms",
    *(f"exam{i}" for i in range(1, MAX_EXAMS + 1)),
    *(f"exam{i}_findings" for i in range(1, MAX_EXAMS + 1)),
    "source",
]


def make_case(index: int, seed: int, stem: str = "clinic_synthetic") -> ClinicCase:
    p = make_presentation(index, seed)
    return ClinicCase(
        case_id=f"{stem}-{index:05d}",
        source="synthetic",
        diagnosis=p.diagnosis,
        symptoms=p.symptoms,
        age=p.age,
        gender=p.gender,
        race=p.race,
        history=p.history,
        exams=p.exams,
        persona=medexagent_persona(index),  # the persona MedExAgent's builder gives this CSV row
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
            row = {
                "age": case.age,
                "gender": case.gender,
                "race": case.race,
                "additional_demographics": case.other_demographics,
                "medical_history": case.history,
                "diagnosis": case.diagnosis,
                "self_reported_symptoms": case.symptoms,
                "source": case.source,
            }
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
                conversation.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {"name": exam.call.name, "arguments": arguments},
                            }
                        ],
                    }
                )
                conversation.append({"role": "tool", "tool_call_id": call_id, "content": exam.findings})
            conversation.append({"role": "assistant", "content": f"[DIAGNOSIS: {case.diagnosis}]"})
            persona = persona_of(case)
            record = {
                "patient_id": case.case_id.rsplit("-", 1)[-1]
                if case.case_id.rsplit("-", 1)[-1].isdigit()
                else n,
                "diagnosis": case.diagnosis,
                "demographics": {
                    "age": case.age,
                    "gender": case.gender,
                    "race": case.race,
                    "additional_demographics": case.other_demographics,
                },
                "medical_history": case.history,
                "self_reported_symptoms": case.symptoms,
                "patient_persona": {
                    "personality": {"key": persona.personality},
                    "language_proficiency": {"key": f"level_{persona.language.lower()}"},
                    "medical_history_recall": {"key": persona.recall},
                },
                "conversation": conversation,
                "source": case.source,
            }
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
