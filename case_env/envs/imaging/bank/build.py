"""`case-env bank build` for imaging: questions from every patient's measurements (or, for checking,
manifests), split by patient.

A template that cannot make its question for a patient (a measurement missing or too close to call, no
distractors far enough from the truth) is skipped for that patient and counted in bank.json per template
and reason; the rest of the bank is built.
"""

from __future__ import annotations

from collections import Counter

from case_env.core import registry
from case_env.core.bank import SPLITS, BankResult, split_cases
from case_env.core.frozen import FrozenDraw
from case_env.core.problems import Problems
from case_env.core.tools import schema_version
from case_env.envs.imaging.bank import anatomist, consultant, radiologist
from case_env.envs.imaging.bank.drafts import BankContext, Question, SkipError, assign_letters, balance
from case_env.envs.imaging.bank.facts import Truth, gather
from case_env.envs.imaging.bank.rows import to_row
from case_env.envs.imaging.clinical import DiagnosisRecord
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.viewer.service import Imaging

TEMPLATES = (*anatomist.TEMPLATES, *radiologist.TEMPLATES, *consultant.TEMPLATES)


def build(
    store: PatientStore,
    seed: int,
    fractions: tuple[float, float, float],
    truth: Truth = "measured",
    diagnoses: dict[str, list[DiagnosisRecord]] | None = None,
) -> BankResult:
    env = registry.get("imaging")
    facts, skipped = gather(store, truth, diagnoses)
    skipped = Problems(skipped)
    ctx = BankContext(Imaging(store), {**anatomist.population(facts), **consultant.population(facts)})
    drafts = []
    reasons: dict[str, Counter] = {}
    for f in facts:
        d = FrozenDraw(seed, f"bank/{f.patient_id}")
        for template in TEMPLATES:
            name = template.__name__
            try:
                made = template(f, d.child(name), ctx)
            except SkipError as exc:
                made = [exc]
            for item in made:
                if isinstance(item, SkipError):
                    reasons.setdefault(name, Counter())[item.reason] += 1
                    skipped.append(f"{f.patient_id} {name}: {item}")
                else:
                    drafts.append(item)
    drafts = balance(drafts, FrozenDraw(seed, "balance"))
    drafts.sort(key=lambda x: (x.patient_id, x.persona.value, x.template, x.stem))
    questions: list[Question] = assign_letters(drafts, FrozenDraw(seed, "letters"))
    patients = split_cases([f.patient_id for f in facts], fractions, seed)
    split_of = {pid: split for split, pids in patients.items() for pid in pids}
    scenario_of = {f.patient_id: f.scenario for f in facts}
    version = schema_version(env.tools)
    tools = list(env.tools)
    rows: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for index, question in enumerate(questions):
        pid = question.draft.patient_id
        persona = env.personas[question.draft.persona.value]
        rows[split_of[pid]].append(
            to_row(question, index, split_of[pid], persona, tools, version, scenario_of[pid]).row()
        )
    counts = {t: dict(sorted(c.items())) for t, c in sorted(reasons.items())}
    return BankResult(rows, patients, skipped, counts)
