"""list_visits: the visits of this patient and what each contains. The usual first call."""

from __future__ import annotations

from case_env.tools.imaging._text import visit_label
from pydantic import BaseModel, ConfigDict

from case_env.core.tools import ToolResult
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.scan_protocol import STATION_NAMES
from case_env.envs.imaging.terms import PERSONAS as IMAGING_PERSONAS

NAME = "list_visits"
DESCRIPTION = (
    "List this patient's imaging visits: the date of each, the interval since baseline, the body stations "
    "and MRI sequences acquired (Dixon water, fat, in-phase, opposed-phase), and whether organ segmentation "
    "and a radiology report exist. Call this first to learn which visits you can compare."
)
PERSONAS = IMAGING_PERSONAS
INLINE = True  # the scanned index, in memory: microseconds, served on the event loop
_STATIONS = "; ".join(f"{i} {name}" for i, name in enumerate(STATION_NAMES, start=1))


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


def run(ctx: ImagingContext, args: Args) -> ToolResult:
    patient = ctx.patients.patient(ctx.patient_id)
    lines = [f"{len(patient.visits)} visit(s)."]
    for vf in patient.visits:
        line = f"{visit_label(vf)}: session {vf.session}"
        if vf.visit != "baseline" and vf.interval_days is not None:
            line += f", {vf.interval_days} days ({vf.interval_days / 365.25:.1f} years) after baseline"
        sequences = ", ".join(c for c in ("water", "fat", "in", "opp") if c in vf.channels) or "none"
        line += f"; sequences: {sequences}; organ segmentation: {'yes' if vf.organs else 'no'}"
        line += f"; radiology report: {'yes' if vf.report_md or vf.report_json else 'no'}."
        lines.append(line)
    lines.append(f"Each scan covers six stations, neck to knee: {_STATIONS}.")
    return ToolResult("\n".join(lines))
