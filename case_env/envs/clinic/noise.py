"""Patient and exam noise, planned per case and applied by the server, in training and evaluation, with
MedExAgent's seven patient and three exam noise types (docs/sources.md, MedExAgent). Two modes:

- `dataset` (the default, MedExAgent's): the bank assigns noise over the whole dataset
  (`medexagent_noise.assign`: exactly round(N x rate) eligible patients or exam slots), writes each row's
  assignment into its create_kwargs, and the server realises it with MedExAgent's tables, each distortion on
  one of the first seven answers.
- `per_case` (ours): a pure function of (case, seed, rates), for cases served without a bank (`/v1/score`,
  ad-hoc eval files) and rates that must not depend on which cases share a bank.

A distorted symptom stays distorted every time the rule-based patient tells it (an LLM patient gets
MedExAgent's one-off hint); the chief complaint is never left out, or the case could not be solved. The plan
is recorded in the row's hidden metadata.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from case_env.core.frozen import FrozenDraw
from case_env.envs.clinic import medexagent_noise
from case_env.envs.clinic.cases import ClinicCase

PATIENT_NOISE = medexagent_noise.PATIENT_TYPES
EXAM_NOISE = medexagent_noise.EXAM_TYPES
TURN_BOUND = ("self_diagnosis", "vague_answer")
NOISY_TURNS = 4  # a turn-bound noise fires on one of the first four answers

BODY_PARTS = {
    "chest": "upper belly",
    "belly": "lower chest",
    "head": "neck",
    "neck": "upper back",
    "knee": "hip",
    "arm": "shoulder",
    "back": "side",
    "side": "back",
    "calf": "thigh",
    "groin": "hip",
    "jaw": "ear",
    "eyes": "forehead",
    "feet": "hands",
    "ankles": "knees",
    "ribs": "back",
    "shoulder": "neck",
    "legs": "arms",
    "cheeks": "forehead",
    "hands": "feet",
    "stomach": "chest",
    "throat": "chest",
}
DESCRIPTORS = {
    "crushing": "stabbing",
    "sharp": "dull",
    "stabbing": "burning",
    "burning": "sharp",
    "throbbing": "stabbing",
    "wet": "dry",
    "dry": "wet",
    "cramping": "burning",
    "boring": "cramping",
    "gnawing": "sharp",
    "colicky": "dull",
    "pounding": "dull",
    "explosive": "dull",
    "dull": "sharp",
    "aching": "burning",
    "slowed down": "restless",
    "weak": "dizzy",
    "drained": "restless",
    "tired": "restless",
    "grinding": "burning",
    "hot": "cold",
    "green": "clear",
    "tingle": "itch",
    "puffy": "itchy",
    "thirsty": "hungry",
}
SEVERITY = {
    "terrible": "mild",
    "severe": "mild",
    "moderate": "mild",
    "mild": "severe",
    "the worst of my life": "quite bad",
    "very": "a little",
}
_DURATION = re.compile(r"\b(\d+) (hours?|days?|weeks?|months?|years?)\b")
SELF_DIAGNOSES = ("just stress", "a bad cold", "something I ate", "a pulled muscle", "my age catching up")
VAGUE = (
    "I can't quite remember, to be honest.",
    "Hmm, I'm not sure. It's hard to say.",
    "I don't really know how to describe it.",
)
FINDING_SIDES = {
    "right": "left",
    "left": "right",
    "upper": "lower",
    "lower": "upper",
    "frontal": "parietal",
    "duodenal": "gastric",
    "medial": "lateral",
    "apex": "base",
    "basal": "apical",
    "distal": "proximal",
}
AMBIGUITY = (
    "Findings are equivocal: {f} Cannot definitively rule out an alternative explanation; "
    "correlate clinically.",
    "Limited study, interpret with caution: {f} The appearance is non-specific.",
)


class NoiseConfig(BaseModel):
    """How noisy a bank's patients and exams are, and (dataset mode) what this row was assigned; travels in
    each row's create_kwargs to the server. Every row carries every key, as verl needs."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(42, description="Noise seed; with the case id it fixes every noise draw.")
    patient_rate: float = Field(0.0, ge=0, le=1, description="Share of noisy patients.")
    exam_rate: float = Field(0.0, ge=0, le=1, description="Share of noisy exam results.")
    mode: Literal["dataset", "per_case"] = Field(
        "dataset", description="dataset: MedExAgent's assignment, made by the bank; per_case: drawn per case."
    )
    patient_types: list[str] = Field(
        default_factory=list, max_length=7, description="Dataset mode: this case's patient noise types."
    )
    exam_slots: list[int] = Field(
        default_factory=list, max_length=20, description="Dataset mode: noisy exams."
    )
    exam_types: list[str] = Field(default_factory=list, max_length=20, description="Their noise types.")

    def assigned(self, patient: tuple[str, ...], exams: dict[int, str]) -> NoiseConfig:
        slots = sorted(exams)
        return self.model_copy(
            update={
                "patient_types": list(patient),
                "exam_slots": slots,
                "exam_types": [exams[s] for s in slots],
            }
        )


@dataclass(frozen=True)
class PatientNoise:
    kind: str
    unit: int | None = None  # the symptom it distorts (unit-bound types)
    turn: int | None = None  # the answer it replaces or extends (turn-bound types)
    detail: str = ""
    told: str | None = None  # the distorted symptom as the patient tells it; None for an omission
    hint: str = ""  # dataset mode: MedExAgent's instruction to an LLM patient on `turn`


@dataclass
class NoisePlan:
    patient: list[PatientNoise] = field(default_factory=list)
    exams: dict[int, str] = field(default_factory=dict)  # recorded-exam slot → exam noise type

    def at_turn(self, turn: int) -> list[PatientNoise]:
        return [n for n in self.patient if n.turn == turn]

    def kinds(self) -> list[str]:
        """`patient:<type>` and `exam:<type>` labels, for accuracy by noise type."""
        labels = {f"patient:{n.kind}" for n in self.patient} | {f"exam:{k}" for k in self.exams.values()}
        return sorted(labels)

    def metadata(self, case: ClinicCase) -> dict:
        """The hidden record written to bank rows and trajectories; never shown to the model."""
        return {
            "patient": [
                {
                    "type": n.kind,
                    "unit": n.unit,
                    "turn": n.turn,
                    "detail": n.detail,
                    "told": n.told,
                    "hint": n.hint,
                }
                for n in self.patient
            ],
            "exams": [
                {"slot": s, "exam": case.exams[s].call.key(), "type": k}
                for s, k in sorted(self.exams.items())
            ],
            "labels": self.kinds(),
        }


def symptom_units(symptoms: str) -> list[str]:
    """The sentences of the symptom text; the first is the chief complaint."""
    parts = re.split(r"(?<=[.!?;])\s+", symptoms.strip())
    return [p.strip() for p in parts if p.strip()]


def _first(text: str, table: dict[str, str]) -> str | None:
    """The earliest word (or phrase) of `text` that the table maps, whole words only."""
    hits = [(m.start(), key) for key in table for m in [re.search(rf"\b{re.escape(key)}\b", text, re.I)] if m]
    return min(hits)[1] if hits else None


def _swap(text: str, table: dict[str, str]) -> tuple[str, str]:
    key = _first(text, table)
    if key is None:
        return text, ""
    new = table[key]

    def keep_case(match: re.Match) -> str:  # "Right lower lobe" → "Left lower lobe"
        return new[:1].upper() + new[1:] if match.group(0)[:1].isupper() else new

    return re.sub(rf"\b{re.escape(key)}\b", keep_case, text, count=1, flags=re.I), f"{key} → {new}"


_UNIT_TABLES = {"body_part_swap": BODY_PARTS, "symptom_confusion": DESCRIPTORS, "severity_change": SEVERITY}


def _applies(kind: str, unit: str, index: int) -> bool:
    if kind in _UNIT_TABLES:
        return _first(unit, _UNIT_TABLES[kind]) is not None
    if kind == "temporal_change":
        return _DURATION.search(unit) is not None
    if kind == "omission":
        return index > 0  # the chief complaint is always told, or the case could not be solved
    return False


def case_rng(seed: int, *parts: object) -> random.Random:
    """A `random.Random` fixed by the seed and the case (string seeds hash the same on every worker)."""
    return random.Random("/".join(str(p) for p in (seed, *parts)))


def plan_noise(case: ClinicCase, config: NoiseConfig) -> NoisePlan:
    if config.mode == "dataset":
        return _dataset_plan(case, config)
    return _per_case_plan(case, config)


def _dataset_plan(case: ClinicCase, config: NoiseConfig) -> NoisePlan:
    """The row's assignment realised with MedExAgent's tables, on our symptom sentences."""
    plan = NoisePlan(
        exams={
            s: t for s, t in zip(config.exam_slots, config.exam_types, strict=False) if s < len(case.exams)
        }
    )
    units = symptom_units(case.symptoms)
    taken: set[int] = set()
    for d in medexagent_noise.realise(
        config.patient_types, case.symptoms, case_rng(config.seed, case.case_id)
    ):
        unit = next(
            (
                i
                for i, u in enumerate(units)
                if d.original and d.original.lower() in u.lower() and i not in taken
            ),
            None,
        )
        if d.kind == "omission" and unit == 0:
            unit = None  # the chief complaint stays told
        told = None
        if unit is not None and d.kind != "omission":
            told = re.compile(re.escape(d.original), re.I).sub(d.replacement, units[unit], count=1)
        if unit is not None:
            taken.add(unit)
        detail = f"{d.original} → {d.replacement}" if d.original and d.replacement else d.replacement
        plan.patient.append(PatientNoise(d.kind, unit, d.turn, detail, told, d.hint))
    return plan


def _per_case_plan(case: ClinicCase, config: NoiseConfig) -> NoisePlan:
    draw = FrozenDraw(config.seed, f"clinic/noise/{case.case_id}")
    plan = NoisePlan()
    units = symptom_units(case.symptoms)
    if config.patient_rate > 0 and draw.chance("patient", config.patient_rate):
        eligible = [
            k for k in PATIENT_NOISE if k in TURN_BOUND or any(_applies(k, u, i) for i, u in enumerate(units))
        ]
        chosen = draw.shuffled("types", eligible)[: draw.integer("count", 1, 3)]
        taken: set[int] = set()
        for kind in chosen:
            if kind in TURN_BOUND:
                plan.patient.append(PatientNoise(kind, turn=draw.integer(f"turn:{kind}", 0, NOISY_TURNS - 1)))
                continue
            options = [i for i, u in enumerate(units) if _applies(kind, u, i) and i not in taken]
            if not options:
                continue
            unit = draw.choice(f"unit:{kind}", options)
            taken.add(unit)
            told, detail = distort(units[unit], kind, draw.child(f"unit{unit}"))
            plan.patient.append(PatientNoise(kind, unit=unit, detail=detail, told=told))
    if config.exam_rate > 0:
        for slot, exam in enumerate(case.exams):
            if draw.chance(f"exam:{slot}", config.exam_rate):
                options = [k for k in EXAM_NOISE if k == "ambiguity" or _exam_applies(k, exam.findings)]
                plan.exams[slot] = draw.choice(f"exam_type:{slot}", options)
    return plan


def distort(unit: str, kind: str, draw: FrozenDraw) -> tuple[str | None, str]:
    """One symptom as the noisy patient tells it, and what changed; None when it is left out."""
    if kind in _UNIT_TABLES:
        return _swap(unit, _UNIT_TABLES[kind])
    if kind == "temporal_change":
        match = _DURATION.search(unit)
        if match is None:
            return unit, ""
        amount = int(match.group(1))
        factor = draw.choice("factor", (0.3, 0.5, 2.0, 3.0))
        changed = max(1, round(amount * factor))
        changed = changed + 1 if changed == amount else changed
        word = match.group(2).rstrip("s") + ("" if changed == 1 else "s")
        return unit[: match.start()] + f"{changed} {word}" + unit[match.end() :], f"{amount} → {changed}"
    if kind == "omission":
        return None, "left out"
    return unit, ""


def told_units(case: ClinicCase, plan: NoisePlan) -> list[str | None]:
    """Every symptom as this patient tells it under the plan (None: never told)."""
    units: list[str | None] = list(symptom_units(case.symptoms))
    for noise in plan.patient:
        if noise.unit is not None:
            units[noise.unit] = noise.told
    return units


def _clauses(findings: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<=[,;:.])\s+", findings.strip()) if c.strip()]


def _exam_applies(kind: str, findings: str) -> bool:
    if kind == "body_part_swap":
        return _first(findings, FINDING_SIDES) is not None
    if kind == "omission":
        return len(_clauses(findings)) >= 2
    return True


def noisy_findings(
    findings: str, kind: str, case_id: str, slot: int, seed: int, mode: str = "dataset"
) -> str:
    if mode == "dataset":
        return medexagent_noise.distort_findings(findings, kind, case_rng(seed, case_id, "exam", slot))
    draw = FrozenDraw(seed, f"clinic/exam-noise/{case_id}/{slot}")
    if kind == "body_part_swap" and _exam_applies(kind, findings):
        return _swap(findings, FINDING_SIDES)[0]
    if kind == "omission" and _exam_applies(kind, findings):
        clauses = _clauses(findings)
        dropped = draw.integer("clause", 0, len(clauses) - 1)
        kept = " ".join(c for i, c in enumerate(clauses) if i != dropped).rstrip(",;:")
        return kept if kept.endswith(".") else kept + "."
    return draw.choice("template", AMBIGUITY).format(f=findings)
