"""read_report: the radiology report written for one visit."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from case_env.core.tools import ErrorCode, ToolError, ToolResult
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.terms import Persona, Visit

NAME = "read_report"
DESCRIPTION = (
    "Read the radiology report of one visit (Markdown): technique, image quality, comparison with the prior "
    "visit, findings per organ with volumes, lesions, other findings and impression. Reports can contain "
    "incidental findings unrelated to the question; check claims against measurements and images."
)
PERSONAS = (Persona.CONSULTANT,)
RESIDENT = True  # reads only through the patient store, which refuses I/O on the event loop


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    visit: Visit = Field(description="Which visit: baseline or follow_up.")


def run(ctx: ImagingContext, args: Args) -> ToolResult:
    ctx.visit(args.visit)
    report = ctx.patients.report(ctx.patient_id, args.visit)
    if report is None or report.markdown is None:
        raise ToolError(ErrorCode.NOT_AVAILABLE, f"no radiology report exists for the {args.visit} visit")
    return ToolResult(report.markdown.strip())
