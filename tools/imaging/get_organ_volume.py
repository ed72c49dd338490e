"""get_organ_volume: one organ's volume (and signal fat fraction) at one visit."""

from __future__ import annotations

from case_env.tools.imaging._text import FAT_FRACTION_ORGANS, ml, organ_words, visit_label
from pydantic import Field

from case_env.core.tools import ToolResult, tool
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.terms import Persona, Visit


# resident: reads only through the patient store, which refuses I/O on the event loop
@tool(personas=(Persona.ANATOMIST, Persona.CONSULTANT), resident=True)
def get_organ_volume(
    ctx: ImagingContext,
    organ: str = Field(description="Organ name, snake_case, e.g. liver, spleen, pancreas, left_kidney."),
    visit: Visit = Field(description="Which visit: baseline or follow_up."),
) -> ToolResult:
    """Measure one organ from the automated segmentation at one visit: volume in mL (1 decimal)
    and, for parenchymal organs and muscles, the signal fat fraction in percent from the Dixon
    fat and water images (not PDFF). Organs use snake_case names such as liver, spleen,
    pancreas, left_kidney, right_kidney, gallbladder, stomach, heart, bladder, aorta,
    left_iliopsoas, right_gluteus_maximus.
    """
    measure = ctx.organ(organ, visit)
    vf = ctx.visit(visit)
    text = f"{organ_words(measure.organ).capitalize()} at {visit_label(vf)}: volume {ml(measure.volume_ml)}"
    if measure.organ in FAT_FRACTION_ORGANS and measure.fat_fraction_pct is not None:
        text += f"; signal fat fraction {measure.fat_fraction_pct:.1f} %"
    return ToolResult(text + ".")
