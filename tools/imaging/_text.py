"""Wording shared by the tools: compact, unit-bearing, the same everywhere."""

from __future__ import annotations

from case_env.envs.imaging.data.index import VisitFiles

# Organs whose signal fat fraction means something (parenchyma and muscle, not fluid, air or bone).
FAT_FRACTION_ORGANS = frozenset(
    {
        "liver",
        "pancreas",
        "spleen",
        "left_kidney",
        "right_kidney",
        "left_iliopsoas",
        "right_iliopsoas",
        "left_autochthon",
        "right_autochthon",
        "left_gluteus_maximus",
        "right_gluteus_maximus",
    }
)


def ml(value: float) -> str:
    return f"{value:,.1f} mL"


def visit_label(vf: VisitFiles) -> str:
    """'baseline (2016-03-02)'."""
    when = vf.acq_date.isoformat() if vf.acq_date else "date unknown"
    return f"{vf.visit} ({when})"


def years(days: int | None) -> str:
    return "an unknown interval" if days is None else f"{days / 365.25:.1f} years"


def organ_words(organ: str) -> str:
    return organ.replace("_", " ")
