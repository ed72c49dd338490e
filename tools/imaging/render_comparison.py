"""render_comparison: baseline and follow-up side by side at the same anatomical position."""

from __future__ import annotations

from case_env.tools.imaging._imaging import POSITION_HELP, SEQUENCE_WORDS, orientation, where
from pydantic import Field

from case_env.core.tools import ErrorCode, ToolError, ToolResult, tool
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.terms import Persona, Sequence
from case_env.envs.imaging.viewer.render import Plane


# renders: CPU-heavy: the render pool, or the event loop when a worker has one core (resident)
# resident: reads only through the patient store, which refuses I/O on the event loop
@tool(personas=(Persona.RADIOLOGIST,), renders=True, resident=True)
def render_comparison(
    ctx: ImagingContext,
    sequence: Sequence = Field(description="Dixon image: water, fat, in (in-phase) or opp (opposed-phase)."),
    plane: Plane = Field(description="Slice plane: axial, coronal or sagittal."),
    organ: str | None = Field(None, description="Organ to cut through, e.g. liver, spleen, right_kidney."),
    position: float | None = Field(None, ge=0, le=100, description=POSITION_HELP),
) -> ToolResult:
    """Show the baseline (left) and follow-up (right) MRI side by side as one image, cut at the
    same anatomical position and displayed with the same intensity window, so differences
    between the halves are changes between visits (new or growing lesions, organ size, fat
    signal). Choose the Dixon sequence (water, fat, in = in-phase, opp = opposed-phase), the
    plane, and an organ or a position.
    """
    visits = ctx.patients.patient(ctx.case_id).visits
    if len(visits) < 2:
        raise ToolError(ErrorCode.NOT_AVAILABLE, "this patient has only one visit; use render_slice")
    first, second = visits[0], visits[1]
    names = [first.visit, second.visit]
    at = ctx.positions(names, plane, organ, position, sequence)
    titles = (f"{first.visit} {first.acq_date or ''}", f"{second.visit} {second.acq_date or ''}")
    panel = ctx.imaging.render_pair(ctx.case_id, (first.visit, second.visit), sequence, at, titles)
    window = panel.window
    text = (
        f"{plane.capitalize()} {SEQUENCE_WORDS[sequence]} images {where(at[first.visit])}: "
        f"{first.visit} ({first.acq_date}) on the left, {second.visit} ({second.acq_date}) on the right, "
        f"same intensity window {window.low:.0f}-{window.high:.0f}. {orientation(plane)} "
        f"1 pixel = {panel.pixel_mm:.2f} mm."
    )
    return ToolResult(text, (panel.png(),))
