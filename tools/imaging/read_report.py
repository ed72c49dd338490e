"""read_report: the radiology report written for one visit."""

from __future__ import annotations

from pydantic import Field

from case_env.core.tools import ErrorCode, ToolError, ToolResult, tool
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.terms import Persona, Visit


# resident: reads only through the patient store, which refuses I/O on the event loop
@tool(personas=(Persona.CONSULTANT,), resident=True)
def read_report(
    ctx: ImagingContext, visit: Visit = Field(description="Which visit: baseline or follow_up.")
) -> ToolResult:
    """Read the radiology report of one visit (Markdown): technique, image quality, comparison with
    the prior visit, findings per organ with volumes, lesions, other findings and impression.
    Reports can contain incidental findings unrelated to the question; check claims against
    measurements and images.
    """
    ctx.visit(visit)
    report = ctx.patients.report(ctx.case_id, visit)
    if report is None or report.markdown is None:
        raise ToolError(ErrorCode.NOT_AVAILABLE, f"no radiology report exists for the {visit} visit")
    return ToolResult(report.markdown.strip())
