"""submit_diagnosis: one attempt at a case-reasoning case's diagnosis, answered correct or incorrect."""

from __future__ import annotations

import asyncio

from pydantic import Field

from case_env.core.llm import asked_judge
from case_env.core.tools import ToolResult, tool
from case_env.envs.casereason.context import ReasoningContext
from case_env.envs.casereason.judge import judge
from case_env.medicine.terminology import icd10cm


# a coroutine: the judge's reply is awaited on the server's loop, holding no thread
@tool(personas=("diagnostician",))
async def submit_diagnosis(
    ctx: ReasoningContext,
    diagnosis: str = Field(min_length=1, max_length=300, description="The name of the disease or entity."),
) -> ToolResult:
    """Submit your diagnosis for this case. You are told whether it is correct; when it is not,
    reconsider the case and submit a different diagnosis, as long as attempts remain. The true
    diagnosis is never revealed.
    """
    case = ctx.case()
    k = ctx.episode.attempts
    n = len(ctx.episode.submissions) + 1
    if n > k:
        return ToolResult(f"No attempts left ({k} of {k} used). Give your final answer.")
    await asyncio.to_thread(icd10cm)  # the grader's index: its first read in this process off the loop
    verdict = await judge(diagnosis.strip(), case.diagnosis, asked_judge())
    fallback = UNJUDGED if verdict.by == "unavailable" else None
    if verdict.correct:
        return ToolResult("Correct. Give this diagnosis as your final answer.", fallback=fallback)
    if n < k:
        text = f"Incorrect. Reconsider the case and submit a different diagnosis ({n} of {k} attempts used)."
    else:
        text = f"Incorrect. That was the last of {k} attempts; give your final answer."
    return ToolResult(text, fallback=fallback)


UNJUDGED = "the judge did not answer (error or timeout); the offline grader decided"
