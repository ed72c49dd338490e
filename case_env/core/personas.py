"""Personas: who the model is, which tools it gets, which data source its rows carry.

One module per persona in an environment's persona package (`personas/<env>/`, installed as
`case_env.personas.<env>`), with DATA_SOURCE (or DATA_SOURCES, the first being its own) and SYSTEM_PROMPT;
ANSWER_RULE, when the persona's answers differ from the package's own `ANSWER_RULE`. The tool subset comes
from the tools (each tool lists its personas), so prompts and schemas cannot disagree.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from case_env.core.tools import FromPackage, ToolSpec, package_modules


@dataclass(frozen=True)
class PersonaSpec:
    name: str
    env: str
    data_source: str
    system_prompt: str
    data_sources: tuple[str, ...]
    tools: tuple[str, ...]


class PersonaSet(dict[str, PersonaSpec]):
    """An environment's personas by name, and the data sources they claim."""

    @property
    def data_sources(self) -> tuple[str, ...]:
        return tuple(s for p in self.values() for s in p.data_sources)

    def of(self, data_source: str) -> PersonaSpec | None:
        """The persona whose rows carry `data_source`."""
        return next((p for p in self.values() if data_source in p.data_sources), None)


def load_personas(package: str, env: str, tools: dict[str, ToolSpec]) -> PersonaSet:
    """Every persona module of the package; a tool naming a persona the package does not have is refused
    (it would otherwise be offered to nobody)."""
    pkg = importlib.import_module(package)
    out = PersonaSet()
    for module in package_modules(package):
        name = getattr(module, "NAME", module.__name__.rsplit(".", 1)[-1])
        rule = getattr(module, "ANSWER_RULE", None) or pkg.ANSWER_RULE
        sources = tuple(getattr(module, "DATA_SOURCES", (module.DATA_SOURCE,)))
        subset = tuple(tool for tool, spec in tools.items() if name in spec.personas)
        prompt = module.SYSTEM_PROMPT.strip() + "\n\n" + rule
        out[name] = PersonaSpec(name, env, module.DATA_SOURCE, prompt, sources, subset)
    for spec in tools.values():
        unknown = [p for p in spec.personas if p not in out]
        if unknown:
            raise TypeError(
                f"tool {spec.name} names persona {unknown[0]!r}, which {env} does not have "
                f"(its personas: {', '.join(out) or 'none'})"
            )
    return out


class Personas(FromPackage):
    """`personas = Personas("package")`: the package's personas, with the tools each is offered."""

    def load(self, env: Any) -> PersonaSet:
        return load_personas(self.package, env.name, env.tools)
