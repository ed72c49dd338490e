"""How a multiple-choice question becomes a bank row (`case_env.core.bank`), with what imaging rows add:
the options keyed by letter, the template and (for reports only) the scenario."""

from __future__ import annotations

from case_env.core.bank import BankRow, ExtraInfo, Message, RewardSpec, tools_kwargs
from case_env.core.personas import PersonaSpec
from case_env.envs.imaging.bank.drafts import Question

ABILITY = "longitudinal_mri_mcq"


class ImagingExtra(ExtraInfo):
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
    extra = ImagingExtra(
        env=persona.env,
        index=index,
        split=split,
        patient_id=draft.patient_id,
        question_idx=index,
        question=draft.stem,
        options=question.options,
        ground_truth=question.answer,
        tools_kwargs=tools_kwargs(draft.patient_id, tools),
        tool_selection=list(persona.tools),
        teacher_insight=draft.insight,
        evidence=draft.evidence,
        template=draft.template,
        scenario=scenario,
        tool_schema_version=version,
    )
    return BankRow(
        data_source=persona.data_source,
        prompt=[
            Message(role="system", content=persona.system_prompt),
            Message(role="user", content=user_message(draft.stem, question.options)),
        ],
        ability=ABILITY,
        reward_model=RewardSpec(ground_truth=question.answer),
        extra_info=extra,
    )
