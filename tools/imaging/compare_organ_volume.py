"""compare_organ_volume: one organ at baseline and follow-up, with the change."""

from __future__ import annotations

from case_env.tools.imaging._text import FAT_FRACTION_ORGANS, ml, organ_words, visit_label, years
from pydantic import Field

from case_env.core.tools import ErrorCode, ToolError, ToolResult, tool
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.terms import Persona


# resident: reads only through the patient store, which refuses I/O on the event loop
@tool(personas=(Persona.ANATOMIST,), resident=True)
def compare_organ_volume(
    ctx: ImagingContext,
    organ: str = Field(description="Organ name, snake_case, e.g. liver, spleen, pancreas, left_kidney."),
) -> ToolResult:
    """Compare one organ's segmented volume between the baseline and follow-up visits: both volumes
    in mL, the absolute change in mL and the relative change in percent (sign shows direction),
    the interval between visits, and for parenchymal organs and muscles the change in signal fat
    fraction in points.
    """
    visits = ctx.patients.patient(ctx.case_id).visits
    if len(visits) < 2:
        raise ToolError(ErrorCode.NOT_AVAILABLE, "this patient has only one visit; use get_organ_volume")
    first, second = visits[0], visits[1]
    before = ctx.organ(organ, first.visit)
    after = ctx.organ(organ, second.visit)
    delta = after.volume_ml - before.volume_ml
    pct = 100.0 * delta / before.volume_ml if before.volume_ml else float("nan")
    text = (
        f"{organ_words(before.organ).capitalize()} volume: {visit_label(first)} {ml(before.volume_ml)}, "
        f"{visit_label(second)} {ml(after.volume_ml)}; change {delta:+,.1f} mL ({pct:+.1f} %) over "
        f"{years(second.interval_days)}."
    )
    if before.organ in FAT_FRACTION_ORGANS and None not in (before.fat_fraction_pct, after.fat_fraction_pct):
        points = after.fat_fraction_pct - before.fat_fraction_pct  # type: ignore[operator]
        text += (
            f" Signal fat fraction {before.fat_fraction_pct:.1f} % -> {after.fat_fraction_pct:.1f} % "
            f"({points:+.1f} points)."
        )
    return ToolResult(text)
