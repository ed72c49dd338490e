"""ask_patient: put one question to the simulated patient of a clinic case."""

from __future__ import annotations

from pydantic import Field

from case_env.core.tools import ToolResult, tool
from case_env.envs.clinic.context import MAX_TEXT, ClinicContext


# remember: later questions of the episode are answered in the light of this one; a coroutine, since an LLM
# patient's reply is awaited on the server's loop (a step's 1,024 episodes wait on it without a thread each)
@tool(personas=("clinician",), remember=True)
async def ask_patient(
    ctx: ClinicContext,
    question: str = Field(min_length=1, max_length=MAX_TEXT, description="Your question to the patient."),
) -> ToolResult:
    """Ask the patient one question in plain language (symptoms, when they started, how bad they
    are, what makes them better or worse, medical history, medicines). The patient answers in
    everyday words and tells more over several questions; patients can be vague, forget or
    misremember.
    """
    case = ctx.case()
    plan = ctx.cases.plan(case, ctx.episode.noise)
    patient = ctx.cases.patient(case, plan, ctx.episode.persona)
    said = await patient.reply(question.strip(), ctx.episode.history, ctx.episode.ordered)
    return ToolResult(said.text, sampled=patient.sampled, fallback=said.fallback)
