"""The CASE parquet schema: how a question becomes a row, and what a valid row is.

Columns (DESIGN.md "Question bank"; the published CASE-Bench banks use the same): `data_source`, `prompt`
(system and user messages), `ability`, `reward_model {style, ground_truth}`, `extra_info` (a JSON string:
patient_id, question_idx, question, options, ground_truth, tools_kwargs, tool_selection, teacher_insight,
evidence) and `agent_name`. Every row lists every tool in `tools_kwargs`, with the same inner keys: parquet
merges structs across rows and verl 0.9.1 fails a call whose tool entry came back as None
(shared/reference/verl-0.9.1.md section 4).
"""

from __future__ import annotations

import json

import pyarrow as pa

from case_env.bank.drafts import Question
from case_env.personas import personas
from case_env.tooling import load_tools

ABILITY = "longitudinal_mri_mcq"
AGENT_NAME = "tool_agent"
REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name")
EXTRA_INFO_KEYS = ("patient_id", "question_idx", "question", "options", "ground_truth", "tools_kwargs",
                   "tool_selection", "teacher_insight", "evidence")  # fmt: skip

ARROW_SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ("extra_info", pa.string()),
    ("agent_name", pa.string()),
])  # fmt: skip


def user_message(question: str, options: dict[str, str]) -> str:
    lines = [question, "", "Options:"] + [f"{letter}) {text}" for letter, text in options.items()]
    lines += ["", "Use the tools to gather the evidence for this patient before you answer. Finish with the letter "
              "of your choice as <answer>X</answer>."]  # fmt: skip
    return "\n".join(lines)


def tools_kwargs(patient_id: str) -> dict:
    return {name: {"create_kwargs": {"patient_id": patient_id}} for name in load_tools()}


def to_row(question: Question, index: int, split: str, schema_version: str, scenario: str = "") -> dict:
    draft = question.draft
    persona = personas()[draft.persona]
    extra = {
        "index": index,
        "split": split,
        "patient_id": draft.patient_id,
        "question_idx": index,
        "question": draft.stem,
        "options": question.options,
        "ground_truth": question.answer,
        "tools_kwargs": tools_kwargs(draft.patient_id),
        "tool_selection": persona.tools,
        "teacher_insight": draft.insight,
        "evidence": draft.evidence,
        "template": draft.template,
        "scenario": scenario,  # for reports only; agents never read it
        "need_tools_kwargs": True,
        "tool_schema_version": schema_version,
    }
    return {
        "data_source": persona.data_source,
        "prompt": [{"role": "system", "content": persona.system_prompt},
                   {"role": "user", "content": user_message(draft.stem, question.options)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": question.answer},
        "extra_info": json.dumps(extra, ensure_ascii=False),
        "agent_name": AGENT_NAME,
    }  # fmt: skip
