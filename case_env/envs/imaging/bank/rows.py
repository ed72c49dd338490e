"""How a multiple-choice question becomes a bank row (`case_env.core.bank`), with what imaging rows add:
the options keyed by letter, the template and (for reports only) the scenario."""

from __future__ import annotations

from typing import Any

from case_env.core.bank import BankRow, ExtraInfo
from case_env.core.personas import PersonaSpec
from case_env.envs.imaging.bank.drafts import Question

ABILITY = "longitudinal_mri_mcq"


class ImagingExtra(ExtraInfo):
    # CASE's fields, optional in the common part and required in CASE's rows
    question_idx: int
    teacher_insight: str
    evidence: list[Any]
    options: dict[str, str]
    template: str = ""
    scenario: str = ""  # for reports only; agents never read it


def user_message(question: str, options: dict[str, str]) -> str:
    lines = [question, "", "Options:"] + [f"{letter}) {text}" for letter, text in options.items()]
    lines += [
        "",
        "Use the tools to gather the evidence for this patient before you answer. Finish with the letter "
        "of your choice as <answer>X</answer>.",
    ]
    return "\n".join(lines)


def to_row(
    question: Question,
    index: int,
    split: str,
    persona: PersonaSpec,
    tools: list[str],
    version: str,
    scenario: str,
) -> BankRow:
    draft = question.draft
    extra = ImagingExtra.for_case(
        persona,
        draft.patient_id,
        index,
        split,
        tools,
        version,
        question=draft.stem,
        options=question.options,
        ground_truth=question.answer,
        teacher_insight=draft.insight,
        evidence=draft.evidence,
        template=draft.template,
        scenario=scenario,
    )
    user = user_message(draft.stem, question.options)
    return BankRow.chat(persona.data_source, persona.system_prompt, user, ABILITY, extra)
