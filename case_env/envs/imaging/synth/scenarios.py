"""The scenario library: what happens to a synthetic patient between baseline and follow-up.

Each scenario edits visit states (never pixels) and states its clinically reportable finding with ICD-10
codes (WHO ICD-10 titles). Magnitudes follow docs/sources.md, Organ volumes and change: a stable subject
changes by about the test-retest noise of automated volumetry (organs within 2 %, muscle -1 to -2 %,
visceral fat +2 to +5 %, liver fat fraction +-0.5 points over about two years, after Whitcher et al. 2022);
steatosis crosses the 5.5 % liver-fat threshold (Wilman et al. 2017); lesion growth meets RECIST 1.1
progression (+20 % and at least 5 mm); a fat-water swap reproduces the commonest Dixon artefact (1.8 % of UK
Biobank participants, Basty et al. 2020).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from case_env.core.frozen import FrozenDraw
from case_env.envs.imaging.icd10 import TITLES
from case_env.envs.imaging.synth.geometry import STATION_NAMES
from case_env.envs.imaging.synth.plan import SIZED_ORGANS, VisitState


@dataclass(frozen=True)
class Diagnosis:
    code: str
    title: str


K76_0 = Diagnosis("K76.0", TITLES["K76.0"])
K76_8 = Diagnosis("K76.8", TITLES["K76.8"])
C78_7 = Diagnosis("C78.7", TITLES["C78.7"])
N28_1 = Diagnosis("N28.1", TITLES["N28.1"])
R16_1 = Diagnosis("R16.1", TITLES["R16.1"])
K86_8 = Diagnosis("K86.8", TITLES["K86.8"])
M62_5 = Diagnosis("M62.5", TITLES["M62.5"])


@dataclass
class LesionTrack:
    """One lesion followed over both visits; diameter None where it is absent."""

    instance: int
    vista_class: int
    organ: str
    kind: str  # cyst | metastasis | haemangioma
    diameters_mm: tuple[float | None, float | None]
    incidental: bool = False
    host_label: int = 0  # the label the lesion must sit inside (organ or vertebral level)
    centre_mm: tuple[float, float, float] | None = None
    location: str = ""


@dataclass
class ScenarioFacts:
    name: str
    title: str
    icd10: list[Diagnosis]
    finding: str  # the clinically reportable change, one sentence
    organs: list[str]  # organs whose true state changed
    lesions: list[LesionTrack] = field(default_factory=list)


def volume_ratio_to_scale(ratio: float) -> float:
    return ratio ** (1.0 / 3.0)


def baseline_state(d: FrozenDraw) -> VisitState:
    scale = {organ: 1.0 for organ in SIZED_ORGANS}
    scale["bladder"] = d.uniform("bladder_fill:1", 0.9, 1.12)  # filling differs per visit
    return VisitState(
        scale=scale,
        liver_ff=d.uniform("liver_ff", 0.015, 0.045),
        pancreas_ff=d.uniform("pancreas_ff", 0.03, 0.06),
        muscle_ff=d.uniform("muscle_ff", 0.03, 0.05),
        sat_mm=d.uniform("sat_mm", 12.0, 30.0),
        vat_frac=d.uniform("vat_frac", 0.25, 0.45),
    )


def stable_follow_up(d: FrozenDraw, base: VisitState) -> VisitState:
    """Two years of nothing in particular: changes within measurement noise."""
    scale = {
        organ: volume_ratio_to_scale(d.uniform(f"stable_ratio:{organ}", 0.985, 1.015))
        for organ in SIZED_ORGANS
    }
    scale["muscle"] = volume_ratio_to_scale(d.uniform("stable_ratio:muscle", 0.98, 0.99))
    scale["bladder"] = d.uniform("bladder_fill:2", 0.9, 1.12)
    return VisitState(
        scale=scale,
        liver_ff=max(0.01, base.liver_ff + d.uniform("stable_liver_ff", -0.005, 0.005)),
        pancreas_ff=max(0.02, base.pancreas_ff + d.uniform("stable_pancreas_ff", -0.005, 0.005)),
        muscle_ff=base.muscle_ff + d.uniform("stable_muscle_ff", 0.0, 0.003),
        sat_mm=base.sat_mm * d.uniform("stable_sat", 0.99, 1.03),
        vat_frac=min(0.6, base.vat_frac * d.uniform("stable_vat", 1.02, 1.05)),
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _stable(d, base, fu) -> ScenarioFacts:
    return ScenarioFacts("stable_control", "Stable control", [], "No significant interval change.", [])


def _steatosis_progression(d, base, fu) -> ScenarioFacts:
    base.liver_ff = d.uniform("sp_ff0", 0.025, 0.045)
    fu.liver_ff = d.uniform("sp_ff1", 0.10, 0.16)
    fu.scale["liver"] = volume_ratio_to_scale(d.uniform("sp_vol", 1.05, 1.10))
    fu.vat_frac = min(0.6, base.vat_frac * d.uniform("sp_vat", 1.10, 1.20))
    fu.sat_mm = base.sat_mm * d.uniform("sp_sat", 1.05, 1.12)
    finding = (
        f"New hepatic steatosis: liver fat fraction rose from {_pct(base.liver_ff)} to {_pct(fu.liver_ff)}, "
        "with liver enlargement and more visceral fat."
    )
    return ScenarioFacts("steatosis_progression", "Steatosis progression", [K76_0], finding, ["liver"])


def _steatosis_regression(d, base, fu) -> ScenarioFacts:
    base.liver_ff = d.uniform("sr_ff0", 0.13, 0.18)
    base.vat_frac = min(0.6, base.vat_frac * 1.15)
    fu.liver_ff = d.uniform("sr_ff1", 0.04, 0.065)
    fu.scale["liver"] = volume_ratio_to_scale(d.uniform("sr_vol", 0.90, 0.95))
    fu.vat_frac = base.vat_frac * d.uniform("sr_vat", 0.75, 0.85)
    fu.sat_mm = base.sat_mm * d.uniform("sr_sat", 0.88, 0.93)
    finding = (
        f"Regression of hepatic steatosis: liver fat fraction fell from {_pct(base.liver_ff)} to "
        f"{_pct(fu.liver_ff)}, with a smaller liver and less visceral fat after weight loss."
    )
    return ScenarioFacts("steatosis_regression", "Steatosis regression", [K76_0], finding, ["liver"])


def _new_liver_lesion(d, base, fu) -> ScenarioFacts:
    kind = "metastasis" if d.chance("nl_kind", 0.6) else "cyst"
    diameter = round(d.uniform("nl_diam", 12.0, 25.0))
    track = LesionTrack(1, 26, "liver", kind, (None, float(diameter)))
    looks = (
        "T1-hypointense solid lesion, suspicious for metastasis" if kind == "metastasis" else "simple cyst"
    )
    finding = f"New {diameter} mm focal liver lesion at follow-up ({looks})."
    dx = [C78_7] if kind == "metastasis" else [K76_8]
    return ScenarioFacts("new_liver_lesion", "New focal liver lesion", dx, finding, ["liver"], [track])


def _growing_liver_lesion(d, base, fu) -> ScenarioFacts:
    d0 = round(d.uniform("gl_d0", 12.0, 16.0))
    d1 = d0 + round(d.uniform("gl_growth", 5.0, 8.0))
    track = LesionTrack(1, 26, "liver", "metastasis", (float(d0), float(d1)))
    finding = f"Enlarging liver lesion: {d0} mm to {d1} mm (+{100 * (d1 - d0) / d0:.0f} %), suspicious for metastasis."
    return ScenarioFacts("growing_liver_lesion", "Growing liver lesion", [C78_7], finding, ["liver"], [track])


def _renal_cyst(d, base, fu) -> ScenarioFacts:
    side = d.choice("rc_side", ["left", "right"])
    organ = f"{side}_kidney"
    cls = 116 if side == "left" else 117
    if d.chance("rc_appears", 0.5):
        d1 = float(round(d.uniform("rc_d1", 12.0, 20.0)))
        track = LesionTrack(1, cls, organ, "cyst", (None, d1))
        finding = f"New {d1:.0f} mm simple cyst in the {side} kidney."
    else:
        d0 = float(round(d.uniform("rc_d0", 10.0, 14.0)))
        d1 = d0 + round(d.uniform("rc_growth", 5.0, 8.0))
        track = LesionTrack(1, cls, organ, "cyst", (d0, d1))
        finding = f"Simple cyst in the {side} kidney enlarged from {d0:.0f} mm to {d1:.0f} mm."
    return ScenarioFacts("renal_cyst", "Renal cyst appearing or growing", [N28_1], finding, [organ], [track])


def _splenomegaly(d, base, fu) -> ScenarioFacts:
    ratio = d.uniform("sm_ratio", 2.2, 2.6)
    fu.scale["spleen"] = volume_ratio_to_scale(ratio)
    finding = f"Interval development of splenomegaly (spleen volume x{ratio:.1f})."
    return ScenarioFacts("splenomegaly", "Splenomegaly developing", [R16_1], finding, ["spleen"])


def _pancreatic_fatty_atrophy(d, base, fu) -> ScenarioFacts:
    base.pancreas_ff = d.uniform("pa_ff0", 0.04, 0.06)
    fu.pancreas_ff = d.uniform("pa_ff1", 0.09, 0.12)
    ratio = d.uniform("pa_vol", 0.88, 0.92)
    fu.scale["pancreas"] = volume_ratio_to_scale(ratio)
    finding = (
        f"Pancreatic fatty atrophy: pancreas volume {100 * (ratio - 1):.0f} % and fat fraction "
        f"{_pct(base.pancreas_ff)} to {_pct(fu.pancreas_ff)}."
    )
    return ScenarioFacts(
        "pancreatic_fatty_atrophy", "Pancreatic fatty atrophy", [K86_8], finding, ["pancreas"]
    )


def _sarcopenia(d, base, fu) -> ScenarioFacts:
    ratio = d.uniform("sa_vol", 0.90, 0.95)
    fu.scale["muscle"] = volume_ratio_to_scale(ratio)
    fu.muscle_ff = base.muscle_ff + d.uniform("sa_ff", 0.02, 0.03)
    finding = (
        f"Loss of skeletal muscle: iliopsoas, autochthon and gluteal volumes {100 * (ratio - 1):.0f} %, "
        "with increased intramuscular fat."
    )
    muscles = [
        f"{side}_{m}" for m in ("iliopsoas", "autochthon", "gluteus_maximus") for side in ("left", "right")
    ]
    return ScenarioFacts("sarcopenia", "Sarcopenia", [M62_5], finding, muscles)


def _fat_water_swap(d, base, fu) -> ScenarioFacts:
    station = d.choice("fw_station", [2, 3, 3, 4])
    fu.fat_water_swap_station = station
    finding = (
        f"No true interval change; the follow-up water and fat images are swapped in station {station} "
        f"({STATION_NAMES[station - 1]}), an artefact of the Dixon reconstruction."
    )
    return ScenarioFacts("fat_water_swap", "Artefact-only control (fat-water swap)", [], finding, [])


ScenarioBuilder = Callable[[FrozenDraw, VisitState, VisitState], ScenarioFacts]

SCENARIOS: dict[str, ScenarioBuilder] = {
    "stable_control": _stable,
    "steatosis_progression": _steatosis_progression,
    "steatosis_regression": _steatosis_regression,
    "new_liver_lesion": _new_liver_lesion,
    "growing_liver_lesion": _growing_liver_lesion,
    "renal_cyst": _renal_cyst,
    "splenomegaly": _splenomegaly,
    "pancreatic_fatty_atrophy": _pancreatic_fatty_atrophy,
    "sarcopenia": _sarcopenia,
    "fat_water_swap": _fat_water_swap,
}


def scenario_for(seed: int, index: int) -> str:
    """Scenarios are dealt round-robin from a seed-shuffled order, so any 10 consecutive patients cover all."""
    order = FrozenDraw(seed, "scenario-order").shuffled("order", list(SCENARIOS))
    return order[index % len(order)]
