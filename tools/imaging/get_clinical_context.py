"""get_clinical_context: demographics and study context that do not give away an answer."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from case_env.core.tools import ToolResult, tool
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.terms import PERSONAS as IMAGING_PERSONAS

# Participant fields a model may see under `history`; everything else (e.g. a synthetic root's scenario)
# stays on the server.
HISTORY_FIELDS = ("height_cm", "weight_kg", "bmi", "smoking_status", "alcohol_intake", "medications")
SEX_WORDS = {"F": "female", "M": "male", "female": "female", "male": "male"}


class Section(StrEnum):
    DEMOGRAPHICS = "demographics"
    STUDY = "study"
    HISTORY = "history"


def _demographics(ctx: ImagingContext) -> str:
    patient = ctx.patients.patient(ctx.case_id)
    sex = SEX_WORDS.get(patient.sex or "", "sex not recorded")
    parts = [sex.capitalize()]
    if patient.age and patient.age.replace(".", "", 1).isdigit():
        age = float(patient.age)
        for vf in patient.visits:
            at = age + (vf.interval_days or 0) / 365.25
            parts.append(f"{int(at)} years at {vf.visit}")
    else:
        parts.append("age not recorded")
    return ", ".join(parts) + "."


STUDY = (
    "Research imaging in a population cohort with a UK Biobank-style protocol: neck-to-knee two-point Dixon "
    "MRI at 1.5 T, repeated after about two years. The scans were not clinically indicated; findings are "
    "read from the images, the automated segmentation and the radiology reports."
)


def _history(ctx: ImagingContext) -> str:
    fields = ctx.patients.patient(ctx.case_id).fields
    shown = [
        f"{key.replace('_', ' ')}: {fields[key]}" for key in HISTORY_FIELDS if fields.get(key, "n/a") != "n/a"
    ]
    return "; ".join(shown) + "." if shown else "No clinical history is recorded for this participant."


# resident: reads only through the patient store, which refuses I/O on the event loop
@tool(personas=IMAGING_PERSONAS, resident=True)
def get_clinical_context(
    ctx: ImagingContext, section: Section = Field(description="Which part: demographics, study or history.")
) -> ToolResult:
    """Get non-imaging context for this patient. section=demographics: sex and age at each visit;
    section=study: why the scans were made and how; section=history: recorded history and
    lifestyle fields, if any.
    """
    if section is Section.DEMOGRAPHICS:
        return ToolResult(_demographics(ctx))
    if section is Section.STUDY:
        return ToolResult(STUDY)
    return ToolResult(_history(ctx))
