"""The ground-truth plan of one synthetic patient: anatomy that stays, visit states that change.

Longitudinal change is a change of parameters, never an edit of pixels: each visit is rendered afresh from
the same subject anatomy with its own visit state, so every change lives consistently in label maps,
images, volumetry and reports. Everything here is plain data written to the phantom manifest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Organs whose size is a subject trait (linear factor) and can change between visits.
SIZED_ORGANS = (
    "liver",
    "spleen",
    "pancreas",
    "left_kidney",
    "right_kidney",
    "gallbladder",
    "stomach",
    "heart",
    "bladder",
    "muscle",
)


@dataclass(frozen=True)
class ShapeNoise:
    """Low-frequency boundary perturbation: unit directions and phases of the sinusoids."""

    directions: tuple[tuple[float, float, float], ...]
    phases: tuple[float, ...]


@dataclass(frozen=True)
class SubjectAnatomy:
    """Traits of the subject that do not change between visits."""

    sex: str  # "F" | "M"
    body_scale: float  # linear, about 1.0 for men and 0.93 for women
    size: dict[str, float]  # linear size factor per organ in SIZED_ORGANS
    jitter_mm: dict[str, tuple[float, float, float]]  # organ centre offsets
    shape_noise: dict[str, ShapeNoise]


@dataclass
class LesionSpec:
    instance: int  # stable across visits
    vista_class: (
        int  # VISTA3D id of the lesion class (26 hepatic tumor, 116/117 kidney cyst, 128 bone lesion)
    )
    organ: str  # host organ name
    kind: str  # cyst | metastasis | haemangioma (tissue)
    diameter_mm: float
    status: str  # baseline | new | stable | enlarging
    incidental: bool
    centre_mm: tuple[float, float, float] | None = None
    location: str = ""  # e.g. "segment VII", "lower pole", "L3 vertebral body"
    previous_diameter_mm: float | None = None


@dataclass
class VisitState:
    """What a scan of this visit would show."""

    scale: dict[str, float]  # linear change factor per organ relative to the subject's size
    liver_ff: float
    pancreas_ff: float
    muscle_ff: float
    sat_mm: float  # subcutaneous fat thickness
    vat_frac: float  # share of the abdominal cavity filled with visceral fat
    lesions: list[LesionSpec] = field(default_factory=list)
    fat_water_swap_station: int | None = None  # artefact: water and fat exchanged in this station (1-6)

    def to_json(self) -> dict:
        return _rounded(asdict(self))


def _rounded(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def rounded(value):
    """JSON-ready copy with floats rounded, so manifests are byte-stable."""
    return _rounded(value)
