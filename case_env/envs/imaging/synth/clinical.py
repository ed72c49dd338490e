"""The synthetic clinical table: each patient's diagnoses with the date first recorded, consistent with the
scenario, plus incidental codes that are true but that the images cannot show.

A scenario's code is first recorded between the visits when its finding appears or develops then, and before
the baseline visit when the finding is already there at baseline (steatosis that later regresses, a liver
lesion that grows, a renal cyst that enlarges), as a hospital record would have it.
"""

from __future__ import annotations

from datetime import date, timedelta

from case_env.core.frozen import FrozenDraw
from case_env.envs.imaging.clinical import DiagnosisRecord
from case_env.envs.imaging.icd10 import INCIDENTAL, title_of
from case_env.envs.imaging.synth.patient import PatientPlan

PRESENT_AT_BASELINE = {"steatosis_regression", "growing_liver_lesion"}


def synthetic_eid(index: int) -> str:
    """A 7-digit id that no UK Biobank application hands out (they start with 1-6)."""
    return str(9_000_001 + index)


def _present_at_baseline(plan: PatientPlan) -> bool:
    name = plan.scenario.name
    if name == "renal_cyst":
        return plan.scenario.lesions[0].diameters_mm[0] is not None
    return name in PRESENT_AT_BASELINE


def diagnoses_for(plan: PatientPlan) -> list[DiagnosisRecord]:
    d = FrozenDraw(plan.seed, f"clinical/{plan.public_id}")
    baseline, follow_up = plan.visits[0].acq_date, plan.visits[1].acq_date

    def before(key: str) -> date:
        return baseline - timedelta(days=d.integer(key, 30, 1500))

    def between(key: str) -> date:
        return baseline + timedelta(days=d.integer(key, 20, (follow_up - baseline).days - 20))

    out = []
    for dx in plan.scenario.icd10:
        when = before(f"dx:{dx.code}") if _present_at_baseline(plan) else between(f"dx:{dx.code}")
        out.append(DiagnosisRecord(dx.code, dx.title, when))
    for n, code in enumerate(d.shuffled("incidental", list(INCIDENTAL))[: d.integer("n-incidental", 0, 2)]):
        when = between(f"inc:{n}") if d.chance(f"inc-between:{n}", 0.4) else before(f"inc:{n}")
        out.append(DiagnosisRecord(code, title_of(code), when))
    return sorted(out, key=lambda r: (r.recorded, r.code))
