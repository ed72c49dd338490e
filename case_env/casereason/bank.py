"""`case-env bank build --env casereason`: one verl row per case, in the CASE conventions.

Two modes. `independent`: the prompt alone, for verl's `single_turn_agent` (k attempts are k samples of the
GRPO group). `sequential`: the `tool_agent` loop with `submit_diagnosis`, which answers "incorrect, reconsider"
up to k - 1 times; k travels in `create_kwargs.attempts`. The clinician's reasoning statements stay in
`extra_info.casereason.statements` for reasoning recall; no model reads them.
"""

from __future__ import annotations

import json

from case_env.bank.build import BankResult, rows_by_split
from case_env.casereason.cases import ReasoningCase
from case_env.personas import personas
from case_env.tooling import Persona, load_tools, schema_version

DATA_SOURCE = "casereason"
ABILITY = "case_diagnosis"
MODES = ("independent", "sequential")
TEMPLATE = (
    "Read the following case presentation and give the most likely diagnosis. First, provide your internal "
    "reasoning for the diagnosis within the tags <think> ... </think>. Then, output the final diagnosis (just "
    "the name of the disease/entity) within the tags <answer> ... </answer>.\n\n"
    "----------------------------------------\nCASE PRESENTATION\n----------------------------------------\n"
    "{case}\n\n"
    "----------------------------------------\nOUTPUT TEMPLATE\n----------------------------------------\n"
    "<think>\n...your internal reasoning for the diagnosis...\n</think>\n<answer>\n...the name of the "
    "disease/entity...\n</answer>"
)  # the prompt public MedCaseReasoning harnesses use (shared/reference/seed-systems.md §3.3)
SEQUENTIAL_RULE = (
    "Submit your diagnosis with submit_diagnosis before you answer; if it is incorrect, reconsider and submit a "
    "different one, up to {k} attempts in all. Then give your final diagnosis in <answer>."
)


def user_message(case: ReasoningCase, mode: str, attempts: int) -> str:
    text = TEMPLATE.format(case=case.prompt.strip())
    return text + ("\n\n" + SEQUENTIAL_RULE.format(k=attempts) if mode == "sequential" else "")


def to_row(case: ReasoningCase, index: int, split: str, mode: str, attempts: int, recall_weight: float,
           version: str) -> dict:  # fmt: skip
    k = attempts if mode == "sequential" else 1
    create = {"patient_id": case.case_id, "attempts": k}
    persona = personas()[Persona.DIAGNOSTICIAN]
    extra = {
        "index": index, "split": split, "patient_id": case.case_id, "question_idx": index,
        "question": "What is the most likely diagnosis?", "ground_truth": case.diagnosis,
        "tools_kwargs": {name: {"create_kwargs": create} for name in load_tools()},
        "tool_selection": persona.tools if mode == "sequential" else [],
        "teacher_insight": "\n".join(f"{i}. {s}" for i, s in enumerate(case.statements, 1))
        + f"\nFinal diagnosis: {case.diagnosis}",
        "evidence": [],
        "casereason": {"mode": mode, "attempts": k, "statements": list(case.statements),
                       "recall_weight": recall_weight, "pmcid": case.pmcid, "title": case.title},
        "need_tools_kwargs": mode == "sequential",
        "tool_schema_version": version,
    }  # fmt: skip
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "system", "content": persona.system_prompt},
                   {"role": "user", "content": user_message(case, mode, k)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": case.diagnosis},
        "extra_info": json.dumps(extra, ensure_ascii=False),
        "agent_name": "tool_agent" if mode == "sequential" else "single_turn_agent",
    }  # fmt: skip


def build(cases: list[ReasoningCase], seed: int, fractions: tuple[float, float, float], mode: str = "independent",
          attempts: int = 10, recall_weight: float = 0.0) -> BankResult:  # fmt: skip
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose {' or '.join(MODES)}")
    version = schema_version(load_tools())
    return rows_by_split(cases, fractions, seed,
                         lambda case, index, split: to_row(case, index, split, mode, attempts, recall_weight, version))  # fmt: skip
