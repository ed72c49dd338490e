"""`case-env bank build`: questions from every patient's ground truth, split by patient, written as parquet."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from case_env.bank import anatomist, consultant, radiologist
from case_env.bank.drafts import BankContext, Question, assign_letters, balance
from case_env.bank.facts import gather
from case_env.bank.schema import ARROW_SCHEMA, to_row
from case_env.data.store import PatientStore
from case_env.imaging.service import Imaging
from case_env.synth.frozen import FrozenDraw
from case_env.tooling import load_tools, schema_version

SPLITS = ("train", "val", "test")
TEMPLATES = (*anatomist.TEMPLATES, *radiologist.TEMPLATES, *consultant.TEMPLATES)


@dataclass
class BankResult:
    rows: dict[str, list[dict]]
    patients: dict[str, list[str]]
    skipped: list[str]

    def counts(self) -> dict[str, Counter]:
        return {split: Counter(r["data_source"] for r in rows) for split, rows in self.rows.items()}


def split_patients(
    patient_ids: list[str], fractions: tuple[float, float, float], seed: int
) -> dict[str, list[str]]:
    """Patients (never questions) go to splits; every split gets at least one patient when there are three."""
    order = FrozenDraw(seed, "splits").shuffled("patients", sorted(patient_ids))
    n = len(order)
    sizes = [round(f * n) for f in fractions]
    if n >= 3:
        for i in range(3):
            if sizes[i] == 0 and fractions[i] > 0:
                sizes[i] = 1
        while sum(sizes) > n:
            sizes[sizes.index(max(sizes))] -= 1
    sizes[0] = n - sum(sizes[1:])
    out, start = {}, 0
    for split, size in zip(SPLITS, sizes, strict=True):
        out[split] = sorted(order[start : start + size])
        start += size
    return out


def rows_by_split(cases: list, fractions: tuple[float, float, float], seed: int, to_row) -> BankResult:
    """One row per case (anything with a `case_id`), cases split by id, indices in id order; `to_row(case,
    index, split)` makes the row. The text environments' banks share this; imaging banks split patients."""
    patients = split_patients([c.case_id for c in cases], fractions, seed)
    split_of = {cid: split for split, ids in patients.items() for cid in ids}
    rows: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for index, case in enumerate(sorted(cases, key=lambda c: c.case_id)):
        split = split_of[case.case_id]
        rows[split].append(to_row(case, index, split))
    return BankResult(rows, patients, [])


def build(store: PatientStore, seed: int, fractions: tuple[float, float, float]) -> BankResult:
    facts, skipped = gather(store)
    ctx = BankContext(Imaging(store), anatomist.population(facts))
    drafts = []
    for f in facts:
        d = FrozenDraw(seed, f"bank/{f.patient_id}")
        for template in TEMPLATES:
            drafts += template(f, d.child(template.__name__), ctx)
    drafts = balance(drafts, FrozenDraw(seed, "balance"))
    drafts.sort(key=lambda x: (x.patient_id, x.persona.value, x.template, x.stem))
    questions: list[Question] = assign_letters(drafts, FrozenDraw(seed, "letters"))
    patients = split_patients([f.patient_id for f in facts], fractions, seed)
    split_of = {pid: split for split, pids in patients.items() for pid in pids}
    scenario_of = {f.patient_id: f.scenario for f in facts}
    version = schema_version(load_tools())
    rows: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for index, question in enumerate(questions):
        split = split_of[question.draft.patient_id]
        scenario = scenario_of[question.draft.patient_id]
        rows[split].append(to_row(question, index, split, version, scenario))
    return BankResult(rows, patients, skipped)


def write(result: BankResult, out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in result.rows.items():
        table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
        pq.write_table(table, out / f"{split}.parquet")
        (out / f"{split}_patients.txt").write_text(
            "".join(f"{p}\n" for p in result.patients[split]), encoding="utf-8"
        )
    summary = {**meta, "counts": {s: dict(c) for s, c in result.counts().items()},
               "patients": {s: len(p) for s, p in result.patients.items()}, "skipped": result.skipped}  # fmt: skip
    (out / "bank.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
