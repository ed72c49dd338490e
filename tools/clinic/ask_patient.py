"""ask_patient: put one question to the simulated patient of a clinic case."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from case_env.core.tools import ToolResult
from case_env.envs.clinic.context import ClinicContext
from case_env.envs.clinic.noise import plan_noise

NAME = "ask_patient"
DESCRIPTION = (
    "Ask the patient one question in plain language (symptoms, when they started, how bad they are, what "
    "makes them better or worse, medical history, medicines). The patient answers in everyday words and "
    "tells more over several questions; patients can be vague, forget or misremember."
)
PERSONAS = ("clinician",)
REMEMBER = True  # later questions of the episode are answered in the light of this one


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=500, description="Your question to the patient.")


def run(ctx: ClinicContext, args: Args) -> ToolResult:
    case = ctx.case()
    plan = plan_noise(case, ctx.episode.noise)
    patient = ctx.store.patient(case, plan)
    return ToolResult(patient.answer(args.question.strip(), ctx.episode.history))
