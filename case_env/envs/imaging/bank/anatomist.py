"""Anatomist questions (data source vista3d_opsd): volumes, fat fraction, change, left versus right."""

from __future__ import annotations

from case_env.core.frozen import FrozenDraw
from case_env.envs.imaging.bank.drafts import BankContext, Draft, SkipError, call, numeric_distractors
from case_env.envs.imaging.bank.facts import VISITS, PatientFacts
from case_env.envs.imaging.terms import Persona

SWAPPED_FAT = 50.0  # a liver signal fat fraction above this is water and fat exchanged, not tissue
VOLUME_ORGANS = ("liver", "spleen", "pancreas", "left_kidney", "right_kidney", "gallbladder")
CHANGE_OPTIONS = ("liver", "spleen", "pancreas", "left_iliopsoas")
WORDS = {
    "left_kidney": "left kidney",
    "right_kidney": "right kidney",
    "left_iliopsoas": "left iliopsoas muscle",
}
VISIT_WORDS = {"baseline": "baseline", "follow_up": "follow-up"}


def words(organ: str) -> str:
    return WORDS.get(organ, organ.replace("_", " "))


def ml(value: float) -> str:
    return f"{value:,.1f} mL"


def organ_volume(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    """Two per patient: an organ's volume at a visit, against volumes of the same organ in other patients."""
    out = []
    organs = d.shuffled("vol-organs", list(VOLUME_ORGANS))[:2]
    for n, organ in enumerate(organs):
        visit = d.choice(f"vol-visit-{n}", VISITS)
        truth = f.visits[visit].volumes[organ]
        pool = [v for pid, v in ctx.population[organ] if pid != f.patient_id]
        picks = numeric_distractors(
            truth,
            pool,
            d.child(f"vol-{organ}"),
            lambda a, b: max(a, b) / min(a, b) >= 1.10,
            fallback_spread=0.25,
        )
        out.append(
            Draft(
                Persona.ANATOMIST,
                "organ_volume",
                "numeric",
                f.patient_id,
                f"What is the volume of the {words(organ)} at the {VISIT_WORDS[visit]} visit, as measured by the "
                "automated organ segmentation?",
                ml(truth),
                [ml(round(p, 1)) for p in picks],
                [call("get_organ_volume", organ=organ, visit=visit)],
                f"get_organ_volume({organ}, {visit}) reports {ml(truth)}; every other option differs from it by more "
                "than 10 %, so only that option matches the measurement.",
            )
        )
    return out


def liver_fat(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    visit = d.choice("fat-visit", VISITS)
    truth = f.visits[visit].fat.get("liver")
    if truth is None:
        raise SkipError("no liver fat fraction", f"the liver has no interior voxels at {visit}")
    if truth > SWAPPED_FAT:
        raise SkipError("water and fat look exchanged", f"liver signal fat fraction {truth} % at {visit}")
    if visit == "follow_up" and f.liver_swapped:
        raise SkipError("fat-water swap in the liver (manifest)", f"station {f.swap_station}")
    pool = [v for pid, v in ctx.population["liver_fat"] if pid != f.patient_id]
    picks = numeric_distractors(
        truth, pool, d.child("fat"), lambda a, b: abs(a - b) >= 0.8, fallback_spread=0.6, jitter=0.1
    )
    fmt = lambda v: f"{max(v, 0.1):.1f} %"  # noqa: E731
    return [
        Draft(
            Persona.ANATOMIST,
            "liver_fat_fraction",
            "numeric",
            f.patient_id,
            f"What is the signal fat fraction of the liver at the {VISIT_WORDS[visit]} visit?",
            fmt(truth),
            [fmt(p) for p in picks],
            [call("get_organ_volume", organ="liver", visit=visit)],
            f"get_organ_volume(liver, {visit}) reports a signal fat fraction of {truth:.1f} %; the other options are "
            "at least 0.8 points away.",
        )
    ]


def most_changed(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    """Which of four organs changed most in relative volume; asked only when one clearly stands out."""
    changes = {o: f.change_pct(o) for o in CHANGE_OPTIONS}
    ranked = sorted(changes, key=lambda o: abs(changes[o]), reverse=True)
    top, second = ranked[0], ranked[1]
    if abs(changes[top]) < 4.0 or abs(changes[top]) - abs(changes[second]) < 3.0:
        raise SkipError(
            "too close to call", f"largest changes {changes[top]:+.1f} % and {changes[second]:+.1f} %"
        )
    detail = ", ".join(f"{words(o)} {changes[o]:+.1f} %" for o in CHANGE_OPTIONS)
    return [
        Draft(
            Persona.ANATOMIST,
            "most_changed",
            top,
            f.patient_id,
            "Between baseline and follow-up, which of these organs changed most in volume, relative to its baseline "
            "volume (in either direction)?",
            words(top).capitalize(),
            [words(o).capitalize() for o in CHANGE_OPTIONS if o != top],
            [call("compare_organ_volume", organ=o) for o in CHANGE_OPTIONS],
            f"compare_organ_volume gives {detail}; the {words(top)} changed most.",
        )
    ]


KIDNEY_OPTIONS = {
    "left_much": "The left kidney is larger, by more than 5 %",
    "right_much": "The right kidney is larger, by more than 5 %",
    "left_slight": "The left kidney is larger, by 5 % or less",
    "right_slight": "The right kidney is larger, by 5 % or less",
}


def kidney_sides(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    visit = d.choice("kidney-visit", VISITS)
    left, right = f.visits[visit].volumes["left_kidney"], f.visits[visit].volumes["right_kidney"]
    larger, smaller = max(left, right), min(left, right)
    excess = 100.0 * (larger - smaller) / smaller
    if abs(excess - 5.0) < 0.5 or left == right:
        raise SkipError("too close to call", f"the larger kidney exceeds the other by {excess:.1f} %")
    side = "left" if left > right else "right"
    category = f"{side}_{'much' if excess > 5 else 'slight'}"
    return [
        Draft(
            Persona.ANATOMIST,
            "kidney_sides",
            category,
            f.patient_id,
            f"At the {VISIT_WORDS[visit]} visit, how do the volumes of the two kidneys compare?",
            KIDNEY_OPTIONS[category],
            [t for c, t in KIDNEY_OPTIONS.items() if c != category],
            [
                call("get_organ_volume", organ="left_kidney", visit=visit),
                call("get_organ_volume", organ="right_kidney", visit=visit),
            ],
            f"Left kidney {ml(left)}, right kidney {ml(right)}: the {side} kidney is larger by {excess:.1f} %.",
        )
    ]


TEMPLATES = (organ_volume, liver_fat, most_changed, kidney_sides)


def population(facts: list[PatientFacts]) -> dict:
    """Measured values of every patient, for drawing numeric distractors."""
    pool: dict[str, list] = {o: [] for o in VOLUME_ORGANS}
    pool["liver_fat"] = []
    for f in facts:
        for v in VISITS:
            for organ in VOLUME_ORGANS:
                pool[organ].append((f.patient_id, f.visits[v].volumes[organ]))
            fat = f.visits[v].fat.get("liver")
            if fat is not None and fat <= SWAPPED_FAT and not (v == "follow_up" and f.liver_swapped):
                pool["liver_fat"].append((f.patient_id, fat))
    return pool
