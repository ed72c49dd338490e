"""list_visits: the visits of this patient and what each contains. The usual first call."""

from __future__ import annotations

from case_env.tools.imaging._text import visit_label

from case_env.core.tools import ToolResult, tool
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.scan_protocol import STATION_NAMES
from case_env.envs.imaging.terms import PERSONAS as IMAGING_PERSONAS

_STATIONS = "; ".join(f"{i} {name}" for i, name in enumerate(STATION_NAMES, start=1))
_STATIONS_LINE = f"Each scan covers six stations, neck to knee: {_STATIONS}."
_SEQUENCES = ("water", "fat", "in", "opp")


# inline: the scanned index, in memory: microseconds, served on the event loop
@tool(personas=IMAGING_PERSONAS, inline=True)
def list_visits(ctx: ImagingContext) -> ToolResult:
    """List this patient's imaging visits: the date of each, the interval since baseline, the body
    stations and MRI sequences acquired (Dixon water, fat, in-phase, opposed-phase), and whether
    organ segmentation and a radiology report exist. Call this first to learn which visits you
    can compare.
    """
    visits = ctx.patients.patient(ctx.case_id).visits
    lines = [f"{len(visits)} visit(s)."]
    for vf in visits:
        after = ""
        if vf.visit != "baseline" and vf.interval_days is not None:
            after = f", {vf.interval_days} days ({vf.interval_days / 365.25:.1f} years) after baseline"
        # a list, not a generator: this tool answers on the event loop, and resuming a generator per item
        # cost as much as the rest of a visit's line
        sequences = ", ".join([c for c in _SEQUENCES if c in vf.channels]) or "none"
        segmented = "yes" if vf.organs else "no"
        reported = "yes" if vf.report_md or vf.report_json else "no"
        lines.append(
            f"{visit_label(vf)}: session {vf.session}{after}; sequences: {sequences}; "
            f"organ segmentation: {segmented}; radiology report: {reported}."
        )
    lines.append(_STATIONS_LINE)
    return ToolResult("\n".join(lines))
