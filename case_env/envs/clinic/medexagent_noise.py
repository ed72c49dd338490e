"""MedExAgent's noise, as published: its tables, its eligibility rules and its dataset-level assignment.

Carried over from MedExAgent's `data/noise.py` (docs/sources.md, MedExAgent): the 26-entry body-part
adjacency map, the symptom confusions, severity swaps, vague answers, self-diagnosis phrases and the
ambiguity templates; which noise types a patient or a findings text is eligible for; and
`plan_dataset_noise_assignments`, re-implemented call for call with Python's `random.Random` so that the same
cases in the same order with the same seed get the same assignments: exactly round(N x patient rate) eligible
patients (1-3 of their eligible types each, seed `seed`) and round(slots x exam rate) of all eligible exam
slots of the dataset (one eligible type each, seed `seed + 1`).

What the assignment picks is then realised per case (`realise`), seeded by (seed, case id) so every sample of
a GRPO group sees the same distortion, as MedExAgent seeds by patient index.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

# fmt: off
BODY_PART_ADJACENCY = {
    "stomach": ("liver", "spleen", "intestines", "pancreas"),
    "liver": ("stomach", "gallbladder", "spleen", "right kidney"),
    "chest": ("upper abdomen", "shoulder", "back"),
    "head": ("neck", "face", "scalp"),
    "knee": ("thigh", "shin", "calf"),
    "lower back": ("hip", "upper back", "buttock"),
    "shoulder": ("neck", "upper arm", "chest"),
    "abdomen": ("stomach", "pelvis", "lower back"),
    "throat": ("neck", "mouth", "esophagus"),
    "hip": ("lower back", "groin", "thigh"),
    "neck": ("shoulder", "throat", "head"),
    "ankle": ("foot", "lower leg"),
    "wrist": ("hand", "forearm"),
    "elbow": ("upper arm", "forearm"),
    "eye": ("forehead", "temple", "cheek"),
    "ear": ("jaw", "temple", "neck"),
    "groin": ("hip", "lower abdomen", "thigh"),
    "pelvis": ("lower abdomen", "hip", "groin"),
    "forearm": ("wrist", "elbow", "upper arm"),
    "thigh": ("hip", "knee", "groin"),
    "calf": ("shin", "ankle", "knee"),
    "back": ("chest", "shoulder", "lower back"),
    "lung": ("chest", "bronchus", "pleura"),
    "heart": ("chest", "left shoulder", "upper back"),
    "kidney": ("lower back", "abdomen", "bladder"),
    "bladder": ("lower abdomen", "kidney", "pelvis"),
}
SYMPTOM_CONFUSIONS = {
    "burning": ("stabbing", "tingling", "stinging"), "sharp": ("dull", "throbbing", "aching"),
    "dull": ("sharp", "aching", "heavy"), "lump": ("tumor", "swelling", "mass", "bump"),
    "nausea": ("dizziness", "lightheadedness"), "fatigue": ("weakness", "exhaustion", "drowsiness"),
    "cramping": ("spasming", "tightening", "aching"), "itching": ("tingling", "burning", "prickling"),
    "numbness": ("tingling", "weakness", "heaviness"), "throbbing": ("pulsating", "pounding", "aching"),
    "stiffness": ("tightness", "soreness", "aching"), "swelling": ("bloating", "puffiness", "lump"),
    "bleeding": ("bruising", "spotting", "discharge"), "cough": ("clearing throat", "choking", "wheezing"),
    "fever": ("chills", "sweating", "hot flashes"),
}
SEVERITY_SWAPS = {
    "severe": "moderate", "moderate": "mild", "mild": "barely noticeable", "intense": "moderate",
    "extreme": "moderate", "excruciating": "severe", "unbearable": "significant", "significant": "mild",
    "terrible": "moderate", "awful": "moderate",
}
# fmt: on
VAGUE_RESPONSES = (
    "I'm not really sure about that.",
    "I can't quite remember.",
    "It's hard to say, honestly.",
    "I don't know, it's been kind of a blur.",
    "I'm not sure, maybe? I can't recall clearly.",
    "I'd rather not get into that.",
    "I don't think I can answer that right now.",
)
SELF_DIAGNOSIS_PHRASES = (
    "I think I might have {condition}.",
    "My neighbor had something similar and said it was {condition}.",
    "I looked it up online and it seems like {condition}.",
    "My friend who's a nurse thinks it could be {condition}.",
)
COMMON_SELF_DIAGNOSES = (
    "a cold",
    "the flu",
    "allergies",
    "food poisoning",
    "a pulled muscle",
    "stress",
    "anxiety",
    "a virus",
    "a pinched nerve",
    "an infection",
)
AMBIGUITY_TEMPLATES = (
    "Findings are equivocal — {original}. Cannot definitively rule out alternative interpretation.",
    "Results show {original}. However, findings are not entirely clear and may warrant further evaluation.",
    "{original}. Note: image quality/sample quality limits definitive interpretation.",
)
PATIENT_TYPES = (
    "body_part_swap",
    "symptom_confusion",
    "severity_change",
    "temporal_change",
    "omission",
    "self_diagnosis",
    "vague_answer",
)
EXAM_TYPES = ("body_part_swap", "omission", "ambiguity")
TURN_WINDOW = 7  # each planned patient noise fires on one of the first seven answers
_DURATION = re.compile(r"\b(\d+)\s*(days?|weeks?|months?|hours?|years?)\b", re.IGNORECASE)


def symptom_list(symptoms: str) -> list[str]:
    return [s.strip().lower() for s in symptoms.split(",") if s.strip()]


def patient_eligible(symptoms: str) -> list[str]:
    """The patient noise types a symptom text allows, in MedExAgent's order."""
    listed = symptom_list(symptoms)
    ok = {
        "body_part_swap": any(part in s for s in listed for part in BODY_PART_ADJACENCY),
        "symptom_confusion": any(word in s for s in listed for word in SYMPTOM_CONFUSIONS),
        "omission": len(listed) > 1,
    }
    return [t for t in PATIENT_TYPES if ok.get(t, True)]


def exam_eligible(findings: str) -> list[str]:
    if not findings.strip():
        return []
    lower = findings.lower()
    ok = {
        "body_part_swap": any(part in lower for part in BODY_PART_ADJACENCY),
        "omission": len([p for p in re.split(r"[;,]", findings) if p.strip()]) > 1,
    }
    return [t for t in EXAM_TYPES if ok.get(t, True)]


@dataclass(frozen=True)
class DatasetNoise:
    patient: dict[int, tuple[str, ...]]  # case index -> its noise types (sorted, as MedExAgent records them)
    exams: dict[int, dict[int, str]]  # case index -> exam slot -> noise type


def assign(
    symptoms: Sequence[str],
    findings: Sequence[Sequence[str]],
    patient_rate: float,
    exam_rate: float,
    seed: int,
) -> DatasetNoise:
    """MedExAgent's `plan_dataset_noise_assignments` over the cases in order (their symptoms and each
    case's exam findings)."""
    patient: dict[int, tuple[str, ...]] = {}
    exams: dict[int, dict[int, str]] = {}
    if patient_rate > 0:
        eligible = {i: types for i, s in enumerate(symptoms) if (types := patient_eligible(s))}
        rng = random.Random(seed)
        order = list(eligible)
        rng.shuffle(order)
        for i in order[: round(len(symptoms) * patient_rate)]:
            types = list(eligible[i])
            rng.shuffle(types)
            patient[i] = tuple(sorted(types[: min(rng.randint(1, 3), len(types))]))
    if exam_rate > 0:
        slots = [
            (i, slot, types)
            for i, texts in enumerate(findings)
            for slot, text in enumerate(texts)
            if (types := exam_eligible(text))
        ]
        rng = random.Random(seed + 1)
        rng.shuffle(slots)
        for i, slot, types in slots[: round(len(slots) * exam_rate)]:
            exams.setdefault(i, {})[slot] = rng.choice(types)
    return DatasetNoise(patient, exams)


@dataclass(frozen=True)
class Distortion:
    kind: str
    turn: int  # the answer it is planned for
    original: str = ""  # what it distorts (a body part, a word, a duration, an omitted symptom)
    replacement: str = ""  # what the patient says instead ("" for an omission)
    hint: str = ""  # MedExAgent's instruction to an LLM patient for that answer


def realise(types: Sequence[str], symptoms: str, rng: random.Random) -> list[Distortion]:
    """MedExAgent's `plan_patient_noise` with forced types: what each type changes, and on which answer."""
    listed = symptom_list(symptoms)
    found: dict[str, tuple[str, str]] = {}

    def first(table: dict) -> tuple[str, tuple] | None:
        for symptom in listed:
            for key, options in table.items():
                if key in symptom:
                    return key, options
        return None

    if "body_part_swap" in types and (hit := first(BODY_PART_ADJACENCY)):
        found["body_part_swap"] = (hit[0], rng.choice(hit[1]))
    if "symptom_confusion" in types and (hit := first(SYMPTOM_CONFUSIONS)):
        found["symptom_confusion"] = (hit[0], rng.choice(hit[1]))
    if "severity_change" in types:
        swap = next(((w, r) for s in listed for w, r in SEVERITY_SWAPS.items() if w in s), None)
        found["severity_change"] = swap or ("", "")
    if "temporal_change" in types:
        found["temporal_change"] = ("", "")
        for symptom in listed:
            match = _DURATION.search(symptom)
            if match:
                number, unit = int(match.group(1)), match.group(2)
                changed = max(1, int(number * rng.uniform(0.3, 2.0)))
                if changed != number:
                    found["temporal_change"] = (f"{number} {unit}", f"{changed} {unit}")
                    break
    if "omission" in types and len(listed) > 1:
        found["omission"] = (rng.choice(listed), "")
    if "self_diagnosis" in types:
        phrase = rng.choice(SELF_DIAGNOSIS_PHRASES).format(condition=rng.choice(COMMON_SELF_DIAGNOSES))
        found["self_diagnosis"] = ("", phrase)
    if "vague_answer" in types:
        found["vague_answer"] = ("", "")
    selected = [t for t in PATIENT_TYPES if t in found]
    rng.shuffle(selected)
    turns = list(range(max(TURN_WINDOW, len(selected))))
    rng.shuffle(turns)
    out = []
    for index, kind in enumerate(selected):
        original, replacement = found[kind]
        if kind == "vague_answer":
            replacement = rng.choice(VAGUE_RESPONSES)
        out.append(Distortion(kind, turns[index], original, replacement, _hint(kind, original, replacement)))
    return out


def _hint(kind: str, original: str, replacement: str) -> str:
    """What MedExAgent's `get_patient_turn_hint` tells the LLM patient on the planned answer."""
    if kind == "vague_answer":
        return f"For this response, be vague and evasive. Say something like '{replacement}' Do not provide specific details."
    if kind == "omission":
        return f"In this response, do NOT mention {original}. Talk only about your other symptoms or details."
    if kind == "self_diagnosis":
        return f"Work the following into your response naturally: '{replacement}' Then answer the doctor's question."
    if kind == "body_part_swap":
        return (
            f"When answering, refer to your {original} symptom as being in your {replacement} area instead."
        )
    if kind == "symptom_confusion":
        return f"When describing the sensation, say '{replacement}' instead of '{original}'."
    if kind == "severity_change":
        change = f"report the symptom as {replacement} instead of {original}" if original else ""
        return f"When answering: {change or 'downplay the severity of your symptoms slightly'}."
    change = f"say {replacement} instead of {original}" if original else ""
    return f"When answering: {change or 'be vague about when symptoms started (a while ago, recently)'}."


def distort_findings(findings: str, kind: str, rng: random.Random) -> str:
    """MedExAgent's `apply_exam_noise` with a forced type (a type that cannot apply becomes ambiguity)."""
    if not findings.strip():
        return findings
    if kind == "body_part_swap":
        lower = findings.lower()
        for part, options in BODY_PART_ADJACENCY.items():
            if part in lower:
                changed = re.compile(re.escape(part), re.IGNORECASE).sub(
                    rng.choice(options), findings, count=1
                )
                if changed != findings:
                    return changed
        kind = "ambiguity"
    if kind == "omission":
        parts = [p.strip() for p in re.split(r"[;,]", findings) if p.strip()]
        if len(parts) > 1:
            dropped = rng.randrange(len(parts))
            return "; ".join(p for i, p in enumerate(parts) if i != dropped)
    return rng.choice(AMBIGUITY_TEMPLATES).format(original=findings)
