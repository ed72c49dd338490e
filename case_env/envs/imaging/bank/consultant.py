"""Consultant questions (data source medboard_opsd): diagnosis from the longitudinal record, and claims
that need both a report and a measurement to check.

Diagnoses come from the clinical table (`case_env.envs.imaging.clinical`): `interval_diagnosis` asks which
imaging-visible diagnosis was first recorded between the two visits, `prior_diagnosis` which was recorded
before the baseline visit, each with "none" as a real option and distractors from other participants'
codes in the same ICD-10 chapter. Without a clinical table, a synthetic root's manifest names the
scenario's diagnosis (`diagnosis`); real data without a table gets no diagnosis questions.
"""

from __future__ import annotations

import math

from case_env.core.frozen import FrozenDraw
from case_env.envs.imaging.bank.anatomist import VISIT_WORDS, words
from case_env.envs.imaging.bank.drafts import BankContext, Draft, SkipError, call
from case_env.envs.imaging.bank.facts import PatientFacts
from case_env.envs.imaging.icd10 import TITLES, chapter_of, imaging_visible, label
from case_env.envs.imaging.synth.scenarios import C78_7, K76_0, K76_8, K86_8, M62_5, N28_1, R16_1
from case_env.envs.imaging.terms import Persona

CODES = [K76_0, K76_8, C78_7, N28_1, R16_1, K86_8, M62_5]
NO_DIAGNOSIS = "No new diagnosis: the record shows no significant interval change"
CLAIM_VERDICTS = {
    "supported": "Supported: the report and the measurement both agree",
    "refuted_report": "Refuted: the report says otherwise",
    "refuted_measurement": "Refuted: the measurement says otherwise",
    "not_determinable": "Cannot be determined from the available record",
}
GRADES = ("normal", "mild steatosis", "moderate steatosis", "severe steatosis")
CLAIM_ORGANS = ("liver", "spleen", "pancreas", "left_kidney", "right_kidney")
# Organs outside the segmentation, with plausible adult volumes (mL) so the claim's number is no tell.
UNSEGMENTED = {
    "thyroid_gland": (10, 25),
    "left_adrenal_gland": (4, 8),
    "duodenum": (40, 90),
    "colon": (300, 600),
}


def diagnosis(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    """The scenario's diagnosis, from the manifest: for synthetic roots without a clinical table."""
    if f.diagnoses is not None:
        return []  # the clinical table's interval_diagnosis and prior_diagnosis ask instead
    if not f.has_manifest:
        raise SkipError("needs a clinical table or a phantom manifest")
    if f.icd10:
        code = f.icd10[0]["code"]
        correct = f"{code} {f.icd10[0]['title']}"
        pool = [f"{c.code} {c.title}" for c in CODES if c.code != code]
        distractors = [NO_DIAGNOSIS, *d.shuffled("dx", pool)[:2]]
        category = code
    else:
        correct, category = NO_DIAGNOSIS, "none"
        distractors = d.shuffled("dx", [f"{c.code} {c.title}" for c in CODES])[:3]
    insight = "The follow-up report's impression and the change since baseline point to: " + correct + "."
    return [
        Draft(
            Persona.CONSULTANT,
            "diagnosis",
            category,
            f.patient_id,
            "Which ICD-10 diagnosis does the change between the baseline and follow-up examinations best support?",
            correct,
            distractors,
            [call("read_report", visit="baseline"), call("read_report", visit="follow_up")],
            insight,
        )
    ]


INTERVAL_NONE = "None of these: no new diagnosis was recorded between the visits"
PRIOR_NONE = "None of these: no such diagnosis was recorded before the baseline visit"


def _visible_codes(f: PatientFacts, when: str) -> list[tuple[str, str]]:
    """(code, title) of imaging-visible diagnoses first recorded before baseline or between the visits."""
    out = []
    for record in f.diagnoses or []:
        day = record.recorded.isoformat()
        before = day < f.baseline_date
        between = f.baseline_date <= day <= f.follow_up_date
        if imaging_visible(record.code) and (before if when == "prior" else between):
            out.append((record.code, record.title))
    return out


def _chapter_codes(chapter: str, n: int, own: set[str], d: FrozenDraw, ctx: BankContext) -> list[str]:
    """n codes of one ICD-10 chapter the participant does not have: other participants' first, then the
    title table's imaging-visible codes."""
    titles = {c: TITLES[c] for c in TITLES if imaging_visible(c)}
    titles.update({c: t for _pid, c, t in sorted(ctx.population["codes"])})
    others = sorted(
        {c for _pid, c, _t in ctx.population["codes"] if c not in own and chapter_of(c) == chapter}
    )
    table = sorted(c for c in titles if chapter_of(c) == chapter and c not in own and c not in others)
    picks = d.shuffled("dx-others", others)[:n]
    picks += d.shuffled("dx-table", table)[: n - len(picks)]
    if len(picks) < n:
        raise SkipError("too few codes in the chapter", f"chapter {chapter}")
    return [label(c, titles[c]) for c in picks]


def _recorded_diagnosis(f: PatientFacts, d: FrozenDraw, ctx: BankContext, when: str) -> list[Draft]:
    if f.diagnoses is None:
        raise SkipError("no clinical table")
    codes = _visible_codes(f, when)
    own = {r.code for r in f.diagnoses}
    none = INTERVAL_NONE if when == "interval" else PRIOR_NONE
    if codes:
        code, title = codes[d.integer("dx-pick", 0, len(codes) - 1)]
        correct, category = label(code, title), code
        distractors = [none, *_chapter_codes(chapter_of(code), 2, own, d, ctx)]
    else:
        # three codes of one chapter, drawn as often as the chapters occur among the participants' codes,
        # so a "none" question's options look like any other's
        chapters = sorted(chapter_of(c) for _pid, c, _t in ctx.population["codes"]) or ["XI"]
        correct, category = none, "none"
        distractors = _chapter_codes(d.choice("dx-chapter", chapters), 3, own, d, ctx)
    if when == "interval":
        stem = (
            "Which diagnosis, first recorded between the baseline and follow-up visits, do the imaging "
            "findings support?"
        )
        insight = "The follow-up report shows a finding that the baseline report does not: " + correct + "."
    else:
        stem = (
            "Which diagnosis, recorded before the baseline visit, do the baseline imaging findings support?"
        )
        insight = "The baseline report already shows the finding of: " + correct + "."
    return [
        Draft(
            Persona.CONSULTANT,
            f"{when}_diagnosis",
            category,
            f.patient_id,
            stem,
            correct,
            distractors,
            [call("read_report", visit="baseline"), call("read_report", visit="follow_up")],
            insight,
        )
    ]


def interval_diagnosis(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    return _recorded_diagnosis(f, d, ctx, "interval")


def prior_diagnosis(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    return _recorded_diagnosis(f, d, ctx, "prior")


def population(facts: list[PatientFacts]) -> dict:
    """Every participant's imaging-visible codes, for same-chapter distractors."""
    codes = [
        (f.patient_id, r.code, r.title) for f in facts for r in f.diagnoses or [] if imaging_visible(r.code)
    ]
    return {"codes": codes}


def _report_statements(f: PatientFacts) -> list[tuple[str, str]]:
    """(true statement, false statement) pairs about the follow-up report."""
    report = f.visits["follow_up"].report or {}
    findings = {x["organ"]: x for x in report.get("findings", [])}
    out = []
    spleen = findings.get("spleen", {}).get("text", "")
    if spleen:
        enlarged = "enlarged" in spleen
        out.append(
            (
                "the follow-up report describes the spleen as enlarged",
                "the follow-up report describes the spleen as normal in size",
            )[:: 1 if enlarged else -1]
        )
    grade = findings.get("liver", {}).get("fat_grade")
    if grade:
        wrong = GRADES[(GRADES.index(grade) + 2) % len(GRADES)]
        out.append(
            (
                f"the follow-up report grades the liver fat as {grade}",
                f"the follow-up report grades the liver fat as {wrong}",
            )
        )
    new = any(les["status"] == "new" for les in report.get("lesions", []))
    out.append(
        (
            "the follow-up report describes a new focal lesion",
            "the follow-up report describes no new focal lesion",
        )[:: 1 if new else -1]
    )
    return out


def claim(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    if not f.visits["follow_up"].report:
        raise SkipError("no follow-up report", "claims are about what the report says")
    out = []
    statements = _report_statements(f)
    organs = d.shuffled("claim-organs", list(CLAIM_ORGANS))
    for n in range(3):
        category = d.choice(f"claim-class-{n}", list(CLAIM_VERDICTS))
        true_report, false_report = statements[d.integer(f"claim-stmt-{n}", 0, len(statements) - 1)]
        organ = organs[n]
        value = f.visits["follow_up"].volumes[organ]
        above = d.chance(f"claim-dir-{n}", 0.5)
        honest = (
            f"more than {math.floor(0.9 * value):,} mL"
            if above
            else f"less than {math.ceil(1.1 * value):,} mL"
        )
        wrong = (
            f"more than {math.ceil(1.1 * value):,} mL"
            if above
            else f"less than {math.floor(0.9 * value):,} mL"
        )
        report_part = false_report if category == "refuted_report" else true_report
        if category == "not_determinable":
            absent = d.choice(f"claim-absent-{n}", list(UNSEGMENTED))
            amount = round(d.uniform(f"claim-absent-ml-{n}", *UNSEGMENTED[absent]))
            measured = (
                f"the {words(absent)} measures {'more' if above else 'less'} than {amount:,} mL at follow-up"
            )
            evidence_organ = absent
        else:
            amount = wrong if category == "refuted_measurement" else honest
            measured = f"the {words(organ)} measures {amount} at follow-up"
            evidence_organ = organ
        text = f'Consider the claim: "{report_part[0].upper() + report_part[1:]}, and {measured}." How does the record bear on it?'
        insight = {
            "supported": f"The report confirms it and get_organ_volume gives {value:,.1f} mL for the {words(organ)}.",
            "refuted_report": f"The report contradicts the first part ({true_report}).",
            "refuted_measurement": f"get_organ_volume gives {value:,.1f} mL for the {words(organ)}, which contradicts the claim.",
            "not_determinable": f"The segmentation has no {words(evidence_organ)}, so that part cannot be checked.",
        }[category]
        out.append(
            Draft(
                Persona.CONSULTANT,
                "claim",
                category,
                f.patient_id,
                text,
                CLAIM_VERDICTS[category],
                [t for c, t in CLAIM_VERDICTS.items() if c != category],
                [
                    call("read_report", visit="follow_up"),
                    call("get_organ_volume", organ=evidence_organ, visit="follow_up"),
                ],
                insight,
            )
        )
    return out


TEMPLATES = (diagnosis, interval_diagnosis, prior_diagnosis, claim)
__all__ = ["TEMPLATES", "VISIT_WORDS"]
