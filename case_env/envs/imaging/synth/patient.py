"""Plan one synthetic patient from (seed, index): demographics, dates, anatomy, scenario, lesions.

Everything here is frozen ground truth (hash draws, see `frozen.py`) plus deterministic geometry, so the
plan, and therefore the manifest, is identical for the same seed on any machine and for both profiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import date, timedelta

import numpy as np

from case_env.core.frozen import FrozenDraw
from case_env.envs.imaging.synth.anatomy import BodyPlan
from case_env.envs.imaging.synth.geometry import Grid
from case_env.envs.imaging.synth.plan import SIZED_ORGANS, LesionSpec, ShapeNoise, SubjectAnatomy, VisitState
from case_env.envs.imaging.synth.raster import rasterize
from case_env.envs.imaging.synth.scenarios import (
    SCENARIOS,
    LesionTrack,
    ScenarioFacts,
    baseline_state,
    scenario_for,
    stable_follow_up,
)

ORGAN_LABELS = {"liver": 1, "left_kidney": 14, "right_kidney": 5}
_NOISY_SHAPES = (
    "liver",
    "spleen",
    "pancreas",
    "left_kidney",
    "right_kidney",
    "stomach",
    "heart",
    "gallbladder",
    "bladder",
    "body",
)
_SIZE_RANGES = {
    "liver": (0.96, 1.04),
    "spleen": (0.93, 1.07),
    "pancreas": (0.94, 1.06),
    "left_kidney": (0.95, 1.05),
    "right_kidney": (0.95, 1.05),
    "gallbladder": (0.85, 1.15),
    "stomach": (0.9, 1.1),
    "heart": (0.95, 1.05),
    "bladder": (0.85, 1.1),
    "muscle": (0.95, 1.05),
}
LESION_MARGIN_MM = 2.0  # tissue of the host organ kept around every lesion


@dataclass
class VisitPlan:
    session: str  # ses-01
    visit: str  # baseline | follow_up
    acq_date: date
    interval_days: int  # since baseline
    age: int
    state: VisitState


@dataclass
class PatientPlan:
    seed: int
    index: int
    public_id: str  # case0001
    subject: str  # sub-0001
    sex: str
    anatomy: SubjectAnatomy
    scenario: ScenarioFacts
    visits: list[VisitPlan]
    lesions: list[LesionTrack] = field(default_factory=list)


def draw_anatomy(d: FrozenDraw) -> SubjectAnatomy:
    sex = "F" if d.chance("sex", 0.5) else "M"
    body_scale = (1.0 if sex == "M" else 0.93) * d.uniform("body_scale", 0.97, 1.03)
    size = {organ: d.uniform(f"size:{organ}", *_SIZE_RANGES[organ]) for organ in SIZED_ORGANS}
    jitter = {
        organ: tuple(d.normal(f"jitter:{organ}:{ax}", 0.0, 4.0) for ax in "xyz")
        for organ in SIZED_ORGANS
        if organ != "muscle"
    }
    noise = {}
    for key in _NOISY_SHAPES:
        dirs = []
        for i in range(6):
            v = np.array([d.normal(f"noise:{key}:{i}:{ax}") for ax in "xyz"])
            v /= np.linalg.norm(v) or 1.0
            dirs.append(tuple(round(float(c), 6) for c in v))
        phases = tuple(d.uniform(f"phase:{key}:{i}", 0.0, 2 * math.pi) for i in range(6))
        noise[key] = ShapeNoise(tuple(dirs), phases)
    return SubjectAnatomy(sex, body_scale, size, jitter, noise)  # type: ignore[arg-type]


def _incidental_lesions(d: FrozenDraw, scenario: str, first_instance: int) -> list[LesionTrack]:
    out = []
    if d.chance("inc:haemangioma", 0.35):
        level = d.choice("inc:haemangioma_level", [("L1", 37), ("L2", 36), ("L3", 35)])
        diameter = float(round(d.uniform("inc:haemangioma_d", 8.0, 11.0)))
        track = LesionTrack(0, 128, "vertebrae", "haemangioma", (diameter, diameter), True, level[1])
        track.location = f"{level[0]} vertebral body"
        out.append(track)
    if scenario != "renal_cyst" and d.chance("inc:renal_cyst", 0.3):
        side = d.choice("inc:renal_side", ["left", "right"])
        diameter = float(round(d.uniform("inc:renal_d", 8.0, 11.0)))
        organ = f"{side}_kidney"
        cls = 116 if side == "left" else 117
        out.append(LesionTrack(0, cls, organ, "cyst", (diameter, diameter), True, ORGAN_LABELS[organ]))
    if "liver_lesion" not in scenario and d.chance("inc:liver_cyst", 0.2):
        diameter = float(round(d.uniform("inc:liver_cyst_d", 8.0, 11.0)))
        out.append(LesionTrack(0, 26, "liver", "cyst", (diameter, diameter), True, ORGAN_LABELS["liver"]))
    for offset, track in enumerate(out):
        track.instance = first_instance + offset
    return out


def _fits(plan: BodyPlan, centre: np.ndarray, radius: float, host: int) -> bool:
    box = tuple((c - radius - 2.0, c + radius + 2.0) for c in centre)
    grid = Grid.around(box, 1.5)  # type: ignore[arg-type]
    labels, _ = rasterize(plan.shapes(), grid)
    X, Y, Z = grid.coords(tuple(slice(0, n) for n in grid.shape))  # type: ignore[arg-type]
    ball = (X - centre[0]) ** 2 + (Y - centre[1]) ** 2 + (Z - centre[2]) ** 2 <= radius**2
    return bool(np.all(labels[ball] == host))


def _place(track: LesionTrack, plans: list[BodyPlan], taken: list[LesionTrack], d: FrozenDraw) -> None:
    radius = max(x for x in track.diameters_mm if x) / 2 + LESION_MARGIN_MM
    host = next(s for s in plans[0].shapes() if track.host_label in s.labels)
    centre = np.array([(lo + hi) / 2 for lo, hi in host.box])
    half = np.array([(hi - lo) / 2 for lo, hi in host.box])
    for attempt in range(400):
        u = np.array([d.uniform(f"lesion{track.instance}:{attempt}:{ax}", -1, 1) for ax in "xyz"])
        if u @ u > 1:
            continue
        candidate = centre + 0.6 * u * half
        clear = all(
            np.linalg.norm(candidate - np.array(o.centre_mm))
            > radius + max(x for x in o.diameters_mm if x) / 2 + LESION_MARGIN_MM
            for o in taken
        )
        if clear and all(_fits(plan, candidate, radius, track.host_label) for plan in plans):
            track.centre_mm = tuple(round(float(c), 2) for c in candidate)  # type: ignore[assignment]
            return
    raise RuntimeError(f"no room for lesion {track.instance} in {track.organ}")


def _location(track: LesionTrack, plan: BodyPlan) -> str:
    if track.location:
        return track.location
    x, y, z = track.centre_mm  # type: ignore[misc]
    if track.organ == "liver":
        right_lobe = next(s for s in plan.shapes() if s.label == 1)
        cx, cy, cz = ((lo + hi) / 2 for lo, hi in right_lobe.box)
        if x < cx - 55:
            return "segment IV" if x > -10 else ("segment II" if z > cz else "segment III")
        anterior, superior = y > cy, z > cz
        return {
            (True, True): "segment VIII",
            (True, False): "segment V",
            (False, True): "segment VII",
            (False, False): "segment VI",
        }[(anterior, superior)]
    kidney = next(s for s in plan.shapes() if s.label == ORGAN_LABELS[track.organ])
    (_, _), (_, _), (z0, z1) = kidney.box
    third = (z1 - z0) / 6
    mid = (z0 + z1) / 2
    return "upper pole" if z > mid + third else "lower pole" if z < mid - third else "interpolar region"


def _lesion_specs(tracks: list[LesionTrack], visit_index: int) -> list[LesionSpec]:
    out = []
    for t in tracks:
        diameter = t.diameters_mm[visit_index]
        if diameter is None:
            continue
        previous = t.diameters_mm[0] if visit_index == 1 else None
        if visit_index == 0:
            status = "baseline"
        elif previous is None:
            status = "new"
        elif diameter - previous >= 5 and diameter >= 1.2 * previous:
            status = "enlarging"
        else:
            status = "stable"
        out.append(
            LesionSpec(
                t.instance,
                t.vista_class,
                t.organ,
                t.kind,
                diameter,
                status,
                t.incidental,
                t.centre_mm,
                t.location,
                previous,
            )
        )
    return out


def plan_patient(seed: int, index: int) -> PatientPlan:
    d = FrozenDraw(seed, f"patient{index}")
    anatomy = draw_anatomy(d)
    name = scenario_for(seed, index)
    base = baseline_state(d)
    follow = stable_follow_up(d, base)
    facts = SCENARIOS[name](d.child(name), base, follow)
    for track in facts.lesions:
        track.host_label = ORGAN_LABELS[track.organ]
    tracks = facts.lesions + _incidental_lesions(d, name, len(facts.lesions) + 1)
    plans = [BodyPlan(anatomy, base), BodyPlan(anatomy, follow)]
    placed: list[LesionTrack] = []
    for track in tracks:
        _place(track, plans, placed, d)
        track.location = _location(track, plans[0])
        placed.append(track)
    base.lesions = _lesion_specs(tracks, 0)
    follow.lesions = _lesion_specs(tracks, 1)

    age = d.integer("age", 46, 72)
    first = date(2014, 6, 1) + timedelta(days=d.integer("baseline_day", 0, 1300))
    interval = d.integer("interval_days", 650, 1000)
    visits = [
        VisitPlan("ses-01", "baseline", first, 0, age, base),
        VisitPlan(
            "ses-02",
            "follow_up",
            first + timedelta(days=interval),
            interval,
            age + round(interval / 365.25),
            follow,
        ),
    ]
    number = index + 1
    return PatientPlan(
        seed, index, f"case{number:04d}", f"sub-{number:04d}", anatomy.sex, anatomy, facts, visits, tracks
    )
