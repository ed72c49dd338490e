"""read_vitals: the patient's vital signs at arrival."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from case_env.core.tools import ToolContext, ToolResult

NAME = "read_vitals"
DESCRIPTION = "Read this patient's vital signs at arrival: heart rate, breathing rate, oxygen saturation, blood pressure."
PERSONAS = ("nurse",)


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


def run(ctx: ToolContext, args: Args) -> ToolResult:
    c = ctx.store.cases[ctx.patient_id]
    return ToolResult(
        f"Heart rate {c.heart_rate}/min, respiratory rate {c.resp_rate}/min, SpO2 {c.spo2} %, "
        f"blood pressure {c.systolic} mmHg systolic."
    )
