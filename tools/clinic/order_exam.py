"""order_exam: order one examination for a clinic case and read its result."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from case_env.core.tools import ErrorCode, ToolError, ToolResult
from case_env.envs.clinic.context import ClinicContext
from case_env.envs.clinic.noise import noisy_findings, plan_noise
from case_env.medicine.exams import EXAMS, PARAMETER_VALUES, ExamError, exam_call

NAME = "order_exam"
DESCRIPTION = (
    "Order one examination or test and receive its result. Set exam and only the parameters that exam "
    "takes (region for imaging, contrast for CT/MRI, source for cultures, site for biopsies, type for "
    "endoscopy, echo, angiography and nuclear scans, target for hormone, marker, serology, PCR and single "
    "blood tests). Every exam costs money and discomfort; order what the history makes necessary."
)
PERSONAS = ("clinician",)

ExamName = StrEnum("ExamName", {name: name for name in EXAMS})
Region, Contrast, Source, Site, ExamType, Target = (
    StrEnum(f"{p.title()}Value", {v: v for v in PARAMETER_VALUES[p]}) for p in PARAMETER_VALUES
)


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exam: ExamName = Field(description="The examination to order.")
    region: Region | None = Field(None, description="Body region (imaging, physical examination).")
    contrast: Contrast | None = Field(None, description="With contrast (CT, MRI); default no.")
    source: Source | None = Field(None, description="Specimen source (culture, flow cytometry).")
    site: Site | None = Field(None, description="Tissue site (biopsy, histopathology, cytology).")
    type: ExamType | None = Field(None, description="Kind of study (endoscopy, echo, angiography, ...).")
    target: Target | None = Field(None, description="What is measured (hormone, marker, pathogen, ...).")


def run(ctx: ClinicContext, args: Args) -> ToolResult:
    case = ctx.case()
    params = {p: getattr(args, p) for p in PARAMETER_VALUES}
    try:
        call = exam_call(args.exam.value, {k: v.value if v is not None else None for k, v in params.items()})
    except ExamError as exc:
        raise ToolError(ErrorCode.INVALID_ARGUMENTS, f"invalid order: {exc}") from None
    charge = f"({call.exam.tiers()})"
    found = case.findings(call)
    if not found:
        return ToolResult(
            f"{call.describe()} {charge}: no result. This exam is not part of this patient's "
            "recorded work-up."
        )
    slot, findings = found[0]
    kind = plan_noise(case, ctx.episode.noise).exams.get(slot)
    if kind is not None:
        findings = noisy_findings(findings, kind, case.case_id, slot, ctx.episode.noise.seed)
    return ToolResult(f"{call.describe()} {charge}: {findings}")
