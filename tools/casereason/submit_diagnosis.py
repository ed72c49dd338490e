"""submit_diagnosis: one attempt at a case-reasoning case's diagnosis, answered correct or incorrect."""

from __future__ import annotations

from pydantic import Field

from case_env.core.llm import default_judge
from case_env.core.tools import ToolResult, tool
from case_env.envs.casereason.context import ReasoningContext
from case_env.envs.casereason.judge import judge


@tool(personas=("diagnostician",))
def submit_diagnosis(
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
    if judge(diagnosis.strip(), case.diagnosis, default_judge()).correct:
        return ToolResult("Correct. Give this diagnosis as your final answer.")
    if n < k:
        return ToolResult(
            f"Incorrect. Reconsider the case and submit a different diagnosis ({n} of {k} attempts used)."
        )
    return ToolResult(f"Incorrect. That was the last of {k} attempts; give your final answer.")
