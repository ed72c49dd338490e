"""Shared argument fields and wording of the two image tools."""

from __future__ import annotations

from case_env.tools.imaging._text import organ_words

from case_env.envs.imaging.viewer.render import ORIENTATION, ORIENTATION_WORDS, Plane
from case_env.envs.imaging.viewer.service import RenderedSlice, SlicePosition

AXIS_NAME = {Plane.AXIAL: "z", Plane.CORONAL: "y", Plane.SAGITTAL: "x"}
SEQUENCE_WORDS = {"water": "water", "fat": "fat", "in": "in-phase", "opp": "opposed-phase"}
POSITION_HELP = (
    "Where to cut, 0-100: percent along the organ's extent when organ is given (default 50, its middle), "
    "else percent along the whole scan from inferior/posterior/patient-left (0) to superior/anterior/"
    "patient-right (100)."
)


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
