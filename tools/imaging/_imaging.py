"""Shared argument fields and wording of the two image tools."""

from __future__ import annotations

from case_env.tools.imaging._text import organ_words

from case_env.core.tools import ErrorCode, ToolError, ToolImage
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.viewer.render import ORIENTATION, ORIENTATION_WORDS, Plane, Raster, encode_png
from case_env.envs.imaging.viewer.service import OrganNotFoundError, RenderedSlice, SlicePosition

AXIS_NAME = {Plane.AXIAL: "z", Plane.CORONAL: "y", Plane.SAGITTAL: "x"}
SEQUENCE_WORDS = {"water": "water", "fat": "fat", "in": "in-phase", "opp": "opposed-phase"}
POSITION_HELP = (
    "Where to cut, 0-100: percent along the organ's extent when organ is given (default 50, its middle), "
    "else percent along the whole scan from inferior/posterior/patient-left (0) to superior/anterior/"
    "patient-right (100)."
)


def positions(
    ctx: ImagingContext,
    visits: list[str],
    plane: Plane,
    organ: str | None,
    percent: float | None,
    sequence: str,
) -> dict[str, SlicePosition]:
    name = None
    if organ is not None:
        name = ctx.organ(organ, visits[0]).organ
        for v in visits[1:]:
            ctx.organ(organ, v)
    percent = 50.0 if percent is None else percent
    try:
        return ctx.imaging.positions(ctx.patient_id, visits, plane, percent, name, sequence)
    except OrganNotFoundError:
        raise ToolError(
            ErrorCode.UNKNOWN_ORGAN, f"organ {organ!r} has no voxels in the segmentation"
        ) from None


def where(position: SlicePosition) -> str:
    axis = AXIS_NAME[position.plane]
    at = f"slice {position.index + 1} of {position.count}, {axis} = {position.mm:.1f} mm"
    if position.organ:
        return f"through the {organ_words(position.organ)} at {position.percent:g} % of its extent ({at})"
    return f"at {position.percent:g} % of the scan ({at})"


def orientation(plane: Plane) -> str:
    left, _, top, _ = ORIENTATION[plane]
    return f"Image left = {ORIENTATION_WORDS[left]}, top = {ORIENTATION_WORDS[top]}."


def legend(rendered: RenderedSlice, limit: int = 10) -> str:
    if not rendered.legend:
        return ""
    shown = ", ".join(f"{organ_words(o)} {c}" for o, c in rendered.legend[:limit])
    more = len(rendered.legend) - limit
    return f" Outlines: {shown}" + (f" and {more} more." if more > 0 else ".")


def png(image: Raster) -> ToolImage:
    return ToolImage(encode_png(image), image.width, image.height)
