"""Synthetic presentations drawn from the condition table: one patient's story of one condition (who they are,
what they tell, which exams were done and what they found), the common source of the clinic's and the
case-reasoning environment's synthetic cases.

Presentations are balanced over conditions, with every choice a FrozenDraw of (seed, case index), so a case
is the same on any machine. About a third of the cases carry their condition's telling symptom; the others
show only what the condition shares with its presenting problem, described in words that often belong to
another condition of that problem, so that an agent must examine.
"""

from __future__ import annotations

from dataclasses import dataclass

from case_env.core.frozen import FrozenDraw
from case_env.medicine.conditions import CONDITIONS, FAMILIES, Condition
from case_env.medicine.exams import RecordedExam, recorded_exam

MAX_RECORDED = 9  # MedExAgent's case filter drops rows reaching exam10
SEVERITIES = ("mild", "moderate", "severe", "terrible")
RACES = ("White", "Black", "Asian", "Hispanic", "mixed")
TYPICAL = 0.2  # share of cases told with the condition's own descriptor (and, apart, time course)
SPECIFIC = 0.25  # share of cases that mention their condition's telling symptom
GENERIC_HISTORY = (
    "no known allergies",
    "appendix removed as a child",
    "takes no regular medicines",
    "a broken wrist years ago",
)


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
    order = draw.shuffled("order", list(recorded))[:MAX_RECORDED]
    return tuple(recorded_exam(e, recorded[e]) for e in order)


@dataclass(frozen=True)
class Presentation:
    diagnosis: str
    symptoms: str
    age: str
    gender: str
    race: str
    history: str
    exams: tuple[RecordedExam, ...]


def make_presentation(index: int, seed: int) -> Presentation:
    names = sorted(CONDITIONS)
    draw = FrozenDraw(seed, f"clinic/{index}")
    rounds = FrozenDraw(seed, "clinic/rounds")  # each round of len(names) cases holds every condition once
    condition = CONDITIONS[rounds.shuffled(str(index // len(names)), names)[index % len(names)]]
    sex = condition.sex if condition.sex != "any" else draw.choice("sex", ("M", "F"))
    history = [h for h in condition.history if draw.chance(f"history:{h}", 0.4)]
    history += [draw.choice("generic", GENERIC_HISTORY)] if draw.chance("has_generic", 0.5) else []
    return Presentation(
        diagnosis=condition.name,
        symptoms=_symptoms(condition, draw),
        age=str(draw.integer("age", *condition.ages)),
        gender=sex,
        race=draw.choice("race", RACES),
        history="; ".join(history) if history else "no significant past medical history",
        exams=_exams(condition, draw),
    )
