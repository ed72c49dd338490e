"""Reading a patient's words against the condition table: how well each condition explains the history and
what the patient said. The textbook of both scripted baselines that diagnose from symptoms (the clinic's
clinicians and the case-reasoning readers)."""

from __future__ import annotations

import re

from case_env.medicine.conditions import CONDITIONS, FAMILIES

_WORD = re.compile(r"[a-z]+")
_STOP = frozenset(
    {
        "i",
        "my",
        "a",
        "the",
        "it",
        "is",
        "and",
        "to",
        "in",
        "of",
        "have",
        "me",
        "on",
        "when",
        "been",
        "that",
        "at",
        "up",
        "do",
        "all",
        "get",
        "feel",
        "feels",
        "some",
        "too",
        "even",
        "from",
        "was",
        "had",
        "with",
        "for",
        "very",
        "really",
        "so",
        "am",
        "after",
        "while",
        "down",
    }
)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 2}


def _overlap(phrase: str, words: set[str]) -> float:
    mine = _words(phrase)
    return len(mine & words) / len(mine) if mine else 0.0


def _patient_facts(prompt: str) -> tuple[str, int | None]:
    """Sex and age as a prompt states them: in words ("54 years old, male") or in MedExAgent's demographic
    lines ("Age: 54 years", "Gender: M")."""
    gender = re.search(r"^Gender:\s*(\w+)", prompt, re.M | re.I)
    said = gender.group(1).lower() if gender else ""
    sex = (
        "F"
        if said in ("f", "female") or re.search(r"\bfemale\b", prompt)
        else "M"
        if said in ("m", "male") or re.search(r"\bmale\b", prompt)
        else ""
    )
    age = re.search(r"(\d+) years old", prompt) or re.search(r"^Age:\s*(\d+)", prompt, re.M | re.I)
    return sex, int(age.group(1)) if age else None


def symptom_scores(prompt: str, answers: str) -> dict[str, float]:
    """How well each condition explains the history and the patient's words."""
    said = _words(answers)
    sex, age = _patient_facts(prompt)
    history = _words(prompt.split("medical history:", 1)[-1]) if "medical history:" in prompt else set()
    scores = {}
    for c in CONDITIONS.values():
        family = FAMILIES[c.family]
        score = 2.0 * _overlap(family.complaint.format(severity="", descriptor="", part=family.part), said)
        score += 1.0 if c.descriptor in answers.lower() else 0.0
        score += sum(3.0 for s in c.symptoms if _overlap(s, said) >= 0.6)
        score += 0.7 if re.search(rf"\d+ {c.duration[2][:-1]}", answers.lower()) else 0.0
        score += sum(0.5 for h in c.history if _overlap(h, history) >= 0.6)
        if (c.sex != "any" and sex and c.sex != sex) or (
            age is not None and not c.ages[0] <= age <= c.ages[1]
        ):
            score -= 2.0
        scores[c.name] = score
    return scores
