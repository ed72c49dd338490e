"""Radiology reports per visit, written from the plan and the measured volumetry.

A report reads like an automated body-MRI read: technique, comparison, per-organ findings with volumes and
change, liver fat grade, lesions with size and status, true but irrelevant incidental findings, impression.
Numbers are the measured ones (what a pipeline would print), rounded as a radiologist would: whole mL,
change to 1 decimal, lesions in whole mm. The structured JSON is the single source; Markdown is rendered
from it. Liver-fat grades follow the proposal in docs/sources.md, Phantom (< 5.5 % normal, to 15 % mild, to
25 % moderate, above severe; 5.5 % from Wilman et al. 2017); splenomegaly above 315 mL (Prassopoulos 1997
upper range).
"""

from __future__ import annotations

from case_env.envs.imaging.data.volumetry import OrganMeasure
from case_env.envs.imaging.synth.geometry import STATION_NAMES
from case_env.envs.imaging.synth.norms import SPLENOMEGALY_ML
from case_env.envs.imaging.synth.patient import PatientPlan
from case_env.envs.imaging.synth.plan import LesionSpec

TECHNIQUE = (
    "1.5 T neck-to-knee two-point Dixon MRI (water, fat, in-phase and opposed-phase reconstructions), "
    "six stations stitched into one volume; automated organ segmentation and volumetry."
)
_KIND_TEXT = {
    "cyst": "well-defined, water-signal lesion consistent with a simple cyst",
    "metastasis": "solid T1-hypointense lesion, suspicious for metastasis",
    "haemangioma": "fat-containing lesion with high signal on fat and water images, typical of a haemangioma",
}


def fat_grade(ff_pct: float) -> str:
    if ff_pct < 5.5:
        return "normal"
    if ff_pct < 15:
        return "mild steatosis"
    if ff_pct < 25:
        return "moderate steatosis"
    return "severe steatosis"


def _change(now: float, before: float | None) -> float | None:
    return None if before in (None, 0) else round(100.0 * (now - before) / before, 1)


def _volume_text(name: str, now: float, before: float | None) -> str:
    text = f"{name} volume {now:,.0f} mL"
    change = _change(now, before)
    if change is not None and before is not None:
        text += f" (previously {before:,.0f} mL, {change:+.1f} %)"
    return text


def _finding(organ: str, name: str, now_ml: float, before_ml: float | None, note: str = "", **extra) -> dict:
    """One organ's line: volume, change against the prior visit, optional extra facts."""
    return {
        "organ": organ,
        "volume_ml": round(now_ml, 1),
        "previous_volume_ml": before_ml,
        "change_pct": _change(now_ml, before_ml),
        **extra,
        "text": _volume_text(name, now_ml, before_ml) + note + ".",
    }


def _liver_finding(now: OrganMeasure, before: OrganMeasure | None, swapped: bool) -> dict:
    previous = before.volume_ml if before else None
    if swapped:
        note = "; fat fraction not assessable because of a fat-water swap in this station"
        return _finding(
            "liver", "Liver", now.volume_ml, previous, note, fat_fraction_pct=None, fat_grade=None
        )
    if now.fat_fraction_pct is None:
        return _finding("liver", "Liver", now.volume_ml, previous, fat_fraction_pct=None, fat_grade=None)
    ff = round(now.fat_fraction_pct, 1)
    note = f"; signal fat fraction {ff:.1f} % ({fat_grade(ff)})"
    if before is not None and before.fat_fraction_pct is not None:
        note += f", previously {before.fat_fraction_pct:.1f} %"
    return _finding(
        "liver", "Liver", now.volume_ml, previous, note, fat_fraction_pct=ff, fat_grade=fat_grade(ff)
    )


def _pancreas_finding(now: OrganMeasure, previous: float | None, swapped: bool) -> dict:
    ff = None if swapped or now.fat_fraction_pct is None else round(now.fat_fraction_pct, 1)
    note = "" if ff is None else f"; signal fat fraction {ff:.1f} %"
    return _finding("pancreas", "Pancreas", now.volume_ml, previous, note, fat_fraction_pct=ff)


def _sum(measures: dict[str, OrganMeasure], organs: tuple[str, ...]) -> float | None:
    present = [measures[o].volume_ml for o in organs if o in measures]
    return sum(present) if present else None


def _lesion_entry(les: LesionSpec) -> dict:
    size = f"{les.diameter_mm:.0f} mm"
    where = f"{les.organ.replace('_', ' ')}" + (f", {les.location}" if les.location else "")
    if les.status == "new":
        status_text = f"New {size} lesion"
    elif les.status == "enlarging":
        status_text = f"Enlarging lesion, now {size} (previously {les.previous_diameter_mm:.0f} mm)"
    elif les.status == "stable":
        status_text = f"Unchanged {size} lesion"
    else:
        status_text = f"{size} lesion"
    return {
        "id": les.instance,
        "organ": les.organ,
        "location": les.location,
        "diameter_mm": round(les.diameter_mm),
        "previous_diameter_mm": None if les.previous_diameter_mm is None else round(les.previous_diameter_mm),
        "status": les.status,
        "incidental": les.incidental,
        "description": f"{status_text} in the {where}: {_KIND_TEXT[les.kind]}.",
    }


def _incidental(now: dict[str, OrganMeasure], lesions: list[dict]) -> list[str]:
    """The report's incidental findings: the organs it does not measure, and the lesions marked incidental."""
    incidental = []
    if "gallbladder" in now:
        incidental.append(
            f"Gallbladder unremarkable ({now['gallbladder'].volume_ml:.0f} mL), no wall thickening."
        )
    if "bladder" in now:
        incidental.append(f"Urinary bladder partially filled ({now['bladder'].volume_ml:.0f} mL).")
    incidental.append("Lung bases clear; no pleural effusion.")
    return incidental + [entry["description"] for entry in lesions if entry["incidental"]]


def build_report(
    plan: PatientPlan,
    visit_index: int,
    measures: list[dict[str, OrganMeasure]],
    unreliable_fat: set[str],
) -> dict:
    """The structured report of one visit; `measures[i]` is visit i's volumetry by organ name."""
    visit = plan.visits[visit_index]
    now = measures[visit_index]
    before = measures[0] if visit_index > 0 else {}
    prior = plan.visits[0] if visit_index > 0 else None
    state = visit.state

    def prev(organ: str) -> float | None:
        return before[organ].volume_ml if organ in before else None

    findings = [
        _liver_finding(now["liver"], before.get("liver"), "liver" in unreliable_fat),
        _finding(
            "spleen",
            "Spleen",
            now["spleen"].volume_ml,
            prev("spleen"),
            "; enlarged" if now["spleen"].volume_ml > SPLENOMEGALY_ML else "; normal size",
        ),
        _pancreas_finding(now["pancreas"], prev("pancreas"), "pancreas" in unreliable_fat),
        *(
            _finding(
                f"{side}_kidney",
                f"{side.capitalize()} kidney",
                now[f"{side}_kidney"].volume_ml,
                prev(f"{side}_kidney"),
            )
            for side in ("right", "left")
        ),
    ]
    psoas = ("left_iliopsoas", "right_iliopsoas")
    psoas_now = _sum(now, psoas)
    if psoas_now is not None:
        findings.append(
            _finding("iliopsoas", "Combined iliopsoas", psoas_now, _sum(before, psoas) if before else None)
        )

    lesions = [_lesion_entry(les) for les in state.lesions]
    incidental = _incidental(now, lesions)
    quality = "Diagnostic; no significant artefact."
    if state.fat_water_swap_station:
        s = state.fat_water_swap_station
        quality = (
            f"Water and fat reconstructions are exchanged in station {s} ({STATION_NAMES[s - 1]}); "
            "in-phase and opposed-phase images are unaffected."
        )

    impression = _impression(plan, visit_index, now, before, lesions)
    return {
        "schema": "case-env/radiology-report@1",
        "patient_id": plan.public_id,
        "session": visit.session,
        "visit": visit.visit,
        "date": visit.acq_date.isoformat(),
        "technique": TECHNIQUE,
        "image_quality": quality,
        "comparison": None
        if prior is None
        else {
            "session": prior.session,
            "date": prior.acq_date.isoformat(),
            "interval_days": visit.interval_days,
        },
        "findings": findings,
        "lesions": lesions,
        "incidental": incidental,
        "impression": impression,
    }


def _follow_up_impression(
    plan: PatientPlan, now: dict[str, OrganMeasure], before: dict[str, OrganMeasure], lesions: list[dict]
) -> str:
    """The reportable change in measured terms (the manifest keeps the true parameters)."""
    name = plan.scenario.name

    def change(organs: tuple[str, ...]) -> float:
        return _change(_sum(now, organs) or 0.0, _sum(before, organs)) or 0.0

    if name in ("steatosis_progression", "steatosis_regression"):
        f0, f1 = before["liver"].fat_fraction_pct or 0.0, now["liver"].fat_fraction_pct or 0.0
        verb = (
            "New hepatic steatosis" if name == "steatosis_progression" else "Regression of hepatic steatosis"
        )
        return (
            f"{verb}: signal fat fraction {f0:.1f} % to {f1:.1f} % ({fat_grade(f1)}), "
            f"liver volume {change(('liver',)):+.1f} %."
        )
    if name == "splenomegaly":
        return (
            f"Interval development of splenomegaly: spleen {before['spleen'].volume_ml:,.0f} mL to "
            f"{now['spleen'].volume_ml:,.0f} mL ({change(('spleen',)):+.0f} %)."
        )
    if name == "pancreatic_fatty_atrophy":
        f0, f1 = before["pancreas"].fat_fraction_pct or 0.0, now["pancreas"].fat_fraction_pct or 0.0
        return (
            f"Pancreatic fatty atrophy: pancreas volume {change(('pancreas',)):+.1f} %, "
            f"signal fat fraction {f0:.1f} % to {f1:.1f} %."
        )
    if name == "sarcopenia":
        psoas = change(("left_iliopsoas", "right_iliopsoas"))
        gluteal = change(("left_gluteus_maximus", "right_gluteus_maximus"))
        return f"Loss of skeletal muscle: iliopsoas {psoas:+.1f} %, gluteus maximus {gluteal:+.1f} %."
    main = [e for e in lesions if not e["incidental"]]
    if main:
        return " ".join(e["description"] for e in main)
    if name == "fat_water_swap":
        station = plan.visits[1].state.fat_water_swap_station or 0
        return (
            f"No significant interval change. Fat-water swap in station {station}: apparent fat signal "
            "changes there are artefactual."
        )
    return "No significant interval change."


def _impression(
    plan: PatientPlan,
    visit_index: int,
    now: dict[str, OrganMeasure],
    before: dict[str, OrganMeasure],
    lesions: list[dict],
) -> list[str]:
    if visit_index > 0:
        lines = [_follow_up_impression(plan, now, before, lesions)]
    else:
        lines = []
        liver_ff = now["liver"].fat_fraction_pct
        if liver_ff is not None and liver_ff >= 5.5:
            lines.append(f"Hepatic steatosis ({fat_grade(liver_ff)}).")
        lines += [
            f"{e['description']} Follow-up imaging recommended." for e in lesions if not e["incidental"]
        ]
        if now["spleen"].volume_ml > SPLENOMEGALY_ML:
            lines.append("Splenomegaly.")
        if not lines:
            lines.append("No significant abnormality of the solid abdominal organs.")
    if any(e["incidental"] for e in lesions):
        lines.append("Incidental findings as above, of no clinical consequence.")
    return lines


def render_markdown(report: dict, title_id: str) -> str:
    lines = [f"# Body MRI report: {title_id}, {report['visit'].replace('_', '-')} ({report['date']})", ""]
    lines += ["## Technique", report["technique"], "", "## Image quality", report["image_quality"], ""]
    comparison = report["comparison"]
    lines += ["## Comparison"]
    if comparison:
        years = comparison["interval_days"] / 365.25
        lines.append(
            f"Compared with {comparison['session']} of {comparison['date']} ({years:.1f} years earlier)."
        )
    else:
        lines.append("None available (first examination).")
    lines += ["", "## Findings"]
    lines += [f"- {f['text']}" for f in report["findings"]]
    lines += [f"- {e['description']}" for e in report["lesions"] if not e["incidental"]]
    lines += ["", "## Other findings"]
    lines += [f"- {text}" for text in report["incidental"]]
    lines += ["", "## Impression"]
    lines += [f"{i}. {text}" for i, text in enumerate(report["impression"], start=1)]
    return "\n".join(lines) + "\n"
