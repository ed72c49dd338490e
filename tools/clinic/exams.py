"""MedExAgent's exam tools: one tool per exam of `case_env.medicine.exams` (`ct(region, contrast)`, `cbc()`,
... 67 of them), under its names, parameters and allowed values, answering as its executor does.

Each bank row offers only its case's work-up tools and a few distractors (`tool_selection`); verl refuses a
call to any other tool before it reaches the server. A call is matched to the recorded work-up by name and
the (parameter, value) pairs given, values compared lower-cased (MedExAgent's `ToolAgent`), and answered with
MedExAgent's result sentence; an exam that is not in the work-up finds nothing ("No significant findings.",
its text). Values outside an exam's allowed list are refused with the list, where MedExAgent would answer
"No significant findings."; either way the call counts in the reward as ordered.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from case_env.core.tools import ToolResult, ToolSpec, tool_spec
from case_env.envs.clinic.context import ClinicContext
from case_env.medicine.exams import EXAMS, FREE_TEXT_MAX, Exam, ExamCall, format_findings

PERSONAS = ("clinician",)
NOT_FOUND = "No significant findings."


class _ExamArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _lower(cls, data: object) -> object:
        """Values compare lower-cased and stripped, as MedExAgent's executor compares them."""
        if isinstance(data, dict):
            return {k: v.strip().lower() if isinstance(v, str) else v for k, v in data.items()}
        return data


def _args(exam: Exam) -> type[BaseModel]:
    fields = {}
    for name, spec in exam.parameters.items():
        kind = Literal[spec.values] if spec.values else str  # type: ignore[valid-type]
        limits = {} if spec.values else {"max_length": FREE_TEXT_MAX}
        if name in exam.required:
            fields[name] = (kind, Field(description=spec.description, **limits))
        else:
            fields[name] = (kind | None, Field(None, description=spec.description, **limits))
    return create_model(f"{exam.name}_args", __base__=_ExamArgs, **fields)


def _runner(exam: Exam):
    def run(ctx: ClinicContext, args: BaseModel) -> ToolResult:
        given = {k: v for k, v in args.model_dump().items() if v is not None}
        found = ctx.result(ExamCall(exam.name, tuple(sorted(given.items()))))
        if found is None:
            return ToolResult(NOT_FOUND)
        recorded, findings = found
        return ToolResult(format_findings(recorded.call, findings))

    return run


# an exam's result depends on the case, the exam and the noise assignment, never on what the patient was
# asked: the server's response cache keys on the noise alone, so a group's rollouts share it
DEPENDS_ON = ("noise",)
TOOLS: list[ToolSpec] = [
    tool_spec(exam.name, exam.description, PERSONAS, _args(exam), _runner(exam), depends_on=DEPENDS_ON)
    for exam in EXAMS.values()
]
