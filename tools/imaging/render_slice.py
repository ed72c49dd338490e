"""render_slice: one MRI slice of one visit as a PNG, optionally with organ outlines."""

from __future__ import annotations

from case_env.tools.imaging._imaging import (
    POSITION_HELP,
    SEQUENCE_WORDS,
    legend,
    orientation,
    png,
    positions,
    where,
)
from case_env.tools.imaging._text import visit_label
from pydantic import BaseModel, ConfigDict, Field

from case_env.core.tools import ToolResult
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.terms import Persona, Sequence, Visit
from case_env.envs.imaging.viewer.render import Plane

NAME = "render_slice"
DESCRIPTION = (
    "Show one 2-D slice of one visit's MRI as an image. Choose the Dixon sequence (water, fat, in = "
    "in-phase, opp = opposed-phase; fat is bright where tissue contains fat), the plane (axial, coronal, "
    "sagittal), and either an organ (the slice cuts through it) or a position along the whole scan. "
    "overlay=true outlines the segmented organs in colour. Images keep true millimetre proportions and "
    "use one intensity window per sequence shared by both visits, so brightness is comparable between visits."
)
RENDERS = True  # CPU-heavy: the render pool, or the event loop when a worker has one core (RESIDENT)
RESIDENT = True  # reads only through the patient store, which refuses I/O on the event loop
PERSONAS = (Persona.ANATOMIST, Persona.RADIOLOGIST)


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    visit: Visit = Field(description="Which visit: baseline or follow_up.")
    sequence: Sequence = Field(description="Dixon image: water, fat, in (in-phase) or opp (opposed-phase).")
    plane: Plane = Field(description="Slice plane: axial, coronal or sagittal.")
    organ: str | None = Field(None, description="Organ to cut through, e.g. liver, spleen, right_kidney.")
    position: float | None = Field(None, ge=0, le=100, description=POSITION_HELP)
    overlay: bool = Field(False, description="true to outline segmented organs in colour (default false).")


def run(ctx: ImagingContext, args: Args) -> ToolResult:
    vf = ctx.visit(args.visit)
    at = positions(ctx, [args.visit], args.plane, args.organ, args.position, args.sequence)[args.visit]
    rendered = ctx.imaging.render(ctx.patient_id, args.visit, args.sequence, at, args.overlay)
    window = rendered.window
    text = (
        f"{args.plane.capitalize()} {SEQUENCE_WORDS[args.sequence]} image, {visit_label(vf)}, {where(at)}. "
        f"{orientation(args.plane)} 1 pixel = {rendered.pixel_mm:.2f} mm. Intensity window "
        f"{window.low:.0f}-{window.high:.0f}, shared by both visits.{legend(rendered)}"
    )
    return ToolResult(text, (png(rendered.image),))
