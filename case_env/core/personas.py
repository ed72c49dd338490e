"""Personas: who the model is, which tools it gets, which data source its rows carry.

One module per persona in an environment's persona package (`personas/<env>/`, installed as
`case_env.personas.<env>`), with DATA_SOURCE (or DATA_SOURCES, the first being its own) and SYSTEM_PROMPT;
ANSWER_RULE, when the persona's answers differ from the package's own `ANSWER_RULE`. The tool subset comes
from the tools (each tool lists its personas), so prompts and schemas cannot disagree.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

from case_env.core.tools import ToolSpec


@dataclass(frozen=True)
class PersonaSpec:
    name: str
    env: str
    data_source: str
    system_prompt: str
    data_sources: tuple[str, ...]
    tools: tuple[str, ...]


def load_personas(package: str, env: str, tools: dict[str, ToolSpec]) -> dict[str, PersonaSpec]:
    pkg = importlib.import_module(package)
    out = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.ispkg:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        name = getattr(module, "NAME", info.name)
        rule = getattr(module, "ANSWER_RULE", None) or pkg.ANSWER_RULE
        sources = tuple(getattr(module, "DATA_SOURCES", (module.DATA_SOURCE,)))
        subset = tuple(tool for tool, spec in tools.items() if name in spec.personas)
        prompt = module.SYSTEM_PROMPT.strip() + "\n\n" + rule
        out[name] = PersonaSpec(name, env, module.DATA_SOURCE, prompt, sources, subset)
    return out
