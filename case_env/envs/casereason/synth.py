"""Original synthetic cases in MedCaseReasoning's format, written from synthetic presentations
(`case_env.medicine.presentations`, the condition table's stories).

Each case is a third-person presentation (demographics, history, the complaint and its course, associated
symptoms, the work-up that was done with its results), numbered reasoning statements in the style of the
dataset (the differential considered, why each alternative was set aside, what confirmed the diagnosis) and
the final diagnosis. The confirming result is in the presentation in about half the cases; in the others
the reader must reason from the presentation alone, which is what makes more attempts worth something.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from case_env.core.frozen import FrozenDraw
from case_env.medicine.conditions import CONDITIONS, FAMILIES
from case_env.medicine.exams import parse_exam_string
from case_env.medicine.presentations import make_presentation

CONFIRMED = 0.5  # share of cases whose presentation includes the confirming result
_VERBS = {
    "have": "has",
    "feel": "feels",
    "get": "gets",
    "wake": "wakes",
    "pee": "pees",
    "am": "is",
    "do": "does",
    "hurt": "hurts",
}


def third_person(sentence: str) -> str:
    text = re.sub(r"\bI'm\b", "the patient is", sentence)
    text = re.sub(r"\bI\b", "the patient", text)
    text = re.sub(r"\bmy\b", "their", text, flags=re.I)
    text = re.sub(r"\bme\b", "them", text)
    text = re.sub(r"\bthe patient (\w+)", lambda m: f"the patient {_VERBS.get(m.group(1), m.group(1))}", text)
    text = text.strip()
    return text[:1].upper() + text[1:]


def make_reasoning_case(index: int, seed: int) -> dict:
    """One MedCaseReasoning-format row (a dict with its columns)."""
    clinic = make_presentation(index, seed)
    condition = CONDITIONS[clinic.diagnosis]
    family = FAMILIES[condition.family]
    draw = FrozenDraw(seed, f"casereason/{index}")
    sex = {"M": "man", "F": "woman"}.get(clinic.gender, "patient")
    told = [third_person(s) for s in re.split(r"(?<=[.])\s+", clinic.symptoms) if s]
    confirmed = draw.chance("confirmed", CONFIRMED)
    shown = [e for e in clinic.exams if confirmed or e.call.key() not in condition.signature]
    results = " ".join(f"{e.call.describe()[:1].upper()}{e.call.describe()[1:]}: {e.findings}" for e in shown)
    prompt = (
        f"A {clinic.age}-year-old {sex} presented to the clinic. Past medical history: {clinic.history}. "
        + " ".join(told)
        + (f" Investigations: {results}" if results else " No investigations were available.")
    )
    kin = draw.shuffled(
        "kin",
        sorted(
            c.name for c in CONDITIONS.values() if c.family == condition.family and c.name != condition.name
        ),
    )[:3]
    key = next(iter(condition.signature))
    key_label = parse_exam_string(key).describe()
    reasoning = [
        f"The presentation with {family.part} symptoms raised a differential including {', '.join(kin)} "
        f"and {condition.name}."
    ]
    for other in kin[:2]:
        exam = parse_exam_string(next(iter(CONDITIONS[other].signature))).describe()
        reasoning.append(
            f"{other[:1].upper()}{other[1:]} was considered less likely because the {exam} "
            f"would be expected to be abnormal and the course did not fit."
        )
    if condition.symptoms[0].lower() in clinic.symptoms.lower():
        reasoning.append(f"{third_person(condition.symptoms[0])} is characteristic of {condition.name}.")
    if confirmed:
        reasoning.append(
            f"The {key_label} showing {condition.findings[key][:1].lower()}"
            f"{condition.findings[key][1:].rstrip('.')} confirmed {condition.name}."
        )
    else:
        reasoning.append(
            f"The history and examination favoured {condition.name}; the {key_label} would confirm it."
        )
    return {
        "pmcid": f"SYN{seed:02d}{index:05d}",
        "title": f"Synthetic case {index + 1}: {condition.family.replace('_', ' ')}",
        "journal": "case-env synthetic",
        "article_link": "",
        "publication_date": "",
        "text": "",
        "case_prompt": prompt,
        "diagnostic_reasoning": "\n".join(f"{i}. {s}" for i, s in enumerate(reasoning, 1)),
        "final_diagnosis": condition.name,
    }


def write_cases(n: int, seed: int, path: Path) -> list[dict]:
    rows = [make_reasoning_case(i, seed) for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return rows
