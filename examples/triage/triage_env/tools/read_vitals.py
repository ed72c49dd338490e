"""read_vitals: the patient's vital signs at arrival."""

from __future__ import annotations

from case_env.core.text_cases import CaseContext
from case_env.core.tools import ToolResult, tool


@tool(personas=("nurse",))
def read_vitals(ctx: CaseContext) -> ToolResult:
    """Read this patient's vital signs at arrival: heart rate, breathing rate, oxygen saturation, blood pressure."""
    c = ctx.case()
    return ToolResult(
        f"Heart rate {c.heart_rate}/min, respiratory rate {c.resp_rate}/min, SpO2 {c.spo2} %, "
        f"blood pressure {c.systolic} mmHg systolic."
    )
