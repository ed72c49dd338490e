"""order_exam: order one examination by name and read its result (the single-tool interface, an option).

Banks built with `--interface order_exam` offer this tool instead of one tool per exam: one schema to learn,
and a prompt that lists the whole vocabulary with its cost tiers. It exists for models that handle a long
enum better than 67 tools, and to compare the two interfaces on the same cases. The exams, matching and
noise are those of the exam tools (`tools/clinic/exams.py`); the result names the exam's cost tiers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from case_env.core.tools import ErrorCode, ToolError, ToolResult, tool_spec
from case_env.envs.clinic.context import ClinicContext
from case_env.medicine.exams import EXAMS, FREE_TEXT_MAX, ExamError, exam_call

DESCRIPTION = (
    "Order one examination or test and receive its result. Set exam and only the parameters that exam "
    "takes, with the allowed values the exam list gives. Every exam costs money and discomfort; order what "
    "the history makes necessary."
)
PERSONAS = ("clinician",)
PARAMETERS = sorted({p for exam in EXAMS.values() for p in exam.parameters})


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exam: Literal[tuple(EXAMS)] = Field(description="The examination to order.")  # type: ignore[valid-type]


Args = create_model(
    "Args",
    __base__=_Base,
    **{
        p: (
            str | None,
            Field(None, max_length=FREE_TEXT_MAX, description=f"The exam's {p}, where it takes one."),
        )
        for p in PARAMETERS
    },
)


def _run(ctx: ClinicContext, args: BaseModel) -> ToolResult:
    params = {p: getattr(args, p) for p in PARAMETERS}
    try:
        call = exam_call(args.exam, params)
    except ExamError as exc:
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, f"invalid order: {exc}") from None
    charge = f"({call.exam.tiers()})"
    found = ctx.result(call)
    if found is None:
        return ToolResult(
            f"{call.describe()} {charge}: no result. This exam is not part of this patient's work-up."
        )
    return ToolResult(f"{call.describe()} {charge}: {found[1]}")


# one tool over a model built from the exam table (its parameters are every exam's), so a table, not @tool
TOOLS = [tool_spec("order_exam", DESCRIPTION, PERSONAS, Args, _run, depends_on=("noise",))]
