"""The three CASE personas: who the model is, which tools it gets, which data source it trains on.

One module per persona (installed as `case_env.personas`), each with NAME, DATA_SOURCE and SYSTEM_PROMPT;
the tool subset comes from the tool registry (each tool lists its personas), so prompts and schemas
cannot disagree.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache

from case_env.tooling import Persona, load_tools

ANSWER_RULE = (
    "When you have the evidence, reason briefly and finish with your choice as a single option letter in "
    "the form <answer>X</answer>. The <answer> tag must be the last thing you write."
)


@dataclass(frozen=True)
class PersonaSpec:
    persona: Persona
    data_source: str
    system_prompt: str
    data_sources: tuple[str, ...] = ()  # every data source of the persona (the clinic has one per origin)

    @property
    def tools(self) -> list[str]:
        return [name for name, spec in load_tools().items() if self.persona in spec.personas]


@cache
def personas() -> dict[Persona, PersonaSpec]:
    out = {}
    for persona in Persona:
        module = importlib.import_module(f"case_env.personas.{persona.value}")
        rule = getattr(module, "ANSWER_RULE", ANSWER_RULE)
        sources = getattr(module, "DATA_SOURCES", (module.DATA_SOURCE,))
        out[persona] = PersonaSpec(
            persona, module.DATA_SOURCE, module.SYSTEM_PROMPT.strip() + "\n\n" + rule, sources
        )
    return out


def by_data_source(data_source: str) -> PersonaSpec | None:
    return next((p for p in personas().values() if data_source in p.data_sources), None)
