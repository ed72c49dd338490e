"""render_slice: one MRI slice of one visit as a PNG, optionally with organ outlines."""

from __future__ import annotations

from case_env.tools.imaging._imaging import (
    POSITION_HELP,
    SEQUENCE_WORDS,
    legend,
    orientation,
    where,
)
from case_env.tools.imaging._text import visit_label
from pydantic import Field

from case_env.core.tools import ToolResult, tool
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.terms import Persona, Sequence, Visit
from case_env.envs.imaging.viewer.render import Plane


# renders: CPU-heavy: the render pool, or the event loop when a worker has one core (resident)
# resident: reads only through the patient store, which refuses I/O on the event loop
@tool(personas=(Persona.ANATOMIST, Persona.RADIOLOGIST), renders=True, resident=True)
def render_slice(
    ctx: ImagingContext,
    visit: Visit = Field(description="Which visit: baseline or follow_up."),
    sequence: Sequence = Field(description="Dixon image: water, fat, in (in-phase) or opp (opposed-phase)."),
    plane: Plane = Field(description="Slice plane: axial, coronal or sagittal."),
    organ: str | None = Field(None, description="Organ to cut through, e.g. liver, spleen, right_kidney."),
    position: float | None = Field(None, ge=0, le=100, description=POSITION_HELP),
    overlay: bool = Field(False, description="true to outline segmented organs in colour (default false)."),
) -> ToolResult:
    """Show one 2-D slice of one visit's MRI as an image. Choose the Dixon sequence (water, fat, in
    = in-phase, opp = opposed-phase; fat is bright where tissue contains fat), the plane (axial,
    coronal, sagittal), and either an organ (the slice cuts through it) or a position along the
    whole scan. overlay=true outlines the segmented organs in colour. Images keep true
    millimetre proportions and use one intensity window per sequence shared by both visits, so
    brightness is comparable between visits.
    """
    vf = ctx.visit(visit)
    at = ctx.positions([visit], plane, organ, position, sequence)[visit]
    rendered = ctx.imaging.render(ctx.case_id, visit, sequence, at, overlay)
    window = rendered.window
    text = (
        f"{plane.capitalize()} {SEQUENCE_WORDS[sequence]} image, {visit_label(vf)}, {where(at)}. "
        f"{orientation(plane)} 1 pixel = {rendered.pixel_mm:.2f} mm. Intensity window "
        f"{window.low:.0f}-{window.high:.0f}, shared by both visits.{legend(rendered)}"
    )
    return ToolResult(text, (rendered.png(),))
