"""ask_patient: put one question to the simulated patient of a clinic case."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from case_env.clinic.noise import plan_noise
from case_env.tooling import Persona, ToolContext, ToolResult

NAME = "ask_patient"
DESCRIPTION = (
    "Ask the patient one question in plain language (symptoms, when they started, how bad they are, what "
    "makes them better or worse, medical history, medicines). The patient answers in everyday words and "
    "tells more over several questions; patients can be vague, forget or misremember."
)
PERSONAS = (Persona.CLINICIAN,)


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=500, description="Your question to the patient.")


def run(ctx: ToolContext, args: Args) -> ToolResult:
    case = ctx.case()
    plan = plan_noise(case, ctx.episode.noise)
    patient = ctx.clinic.patient(case, plan)  # type: ignore[union-attr]  # ctx.case() checked the store
    return ToolResult(patient.answer(args.question.strip(), ctx.episode.history))
