"""The registry: every installed environment, found through the entry-point group `case_env.environments`.

An entry point names an `Environment` subclass (`name = "package.module:Class"`, the entry point's name
equal to the class's `name`). The three built-in environments register the same way in this project's
pyproject.toml; another package adds one by declaring its own entry point, and nothing here changes.

Rows are routed by `extra_info.env`; a row without it (a published CASE-Bench bank) by the environment
whose personas claim its data source, else by the default environment. Tool names and data sources must
be unique across environments: a call or a row names exactly one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model

from case_env.core.calls import Weight
from case_env.core.environment import Environment
from case_env.core.parts import Benchmarks, Commands, Data, Evaluation, Training, evaluation_of
from case_env.core.text_cases import TextCases
from case_env.core.tools import MODEL_FAULTS, ToolSpec

GROUP = "case_env.environments"
log = logging.getLogger("case_env.registry")


# Every optional part and the commands that use it: `case-env envs --verbose` names an environment's parts, and
# docs/architecture.md's table of parts is `parts_table()`.
PARTS: dict[type, str] = {
    Data: "`bank build`, `bank validate`, `data check`, `synth`",
    TextCases: "`serve`, `bank build`, `data check`",
    Evaluation: "`eval --agent`, `report`, `rollouts`, /openapi.json",
    Training: "`train run`, `train preflight`, `train_sft.sh`, `rollouts`, `eval`",
    Benchmarks: "`bench ...`",
    Commands: "the command line",
}


def parts_table() -> str:
    """The parts as a markdown table: each part's members, the first sentence of its docstring, its users."""
    rows = ["| part | members | what it adds | used by |", "|---|---|---|---|"]
    for part, used_by in PARTS.items():
        names = dict.fromkeys([*getattr(part, "__annotations__", {}), *vars(part)])
        members = ", ".join(f"`{n}`" for n in names if not n.startswith("_"))
        adds = " ".join((part.__doc__ or "").split()).split(". ")[0].rstrip(".")
        rows.append(f"| `{part.__name__}` | {members} | {adds} | {used_by} |")
    return "\n".join(rows)


class RegistryError(LookupError):
    """An environment that is not registered, or registrations that contradict each other."""


@cache
def _loaded() -> tuple[dict[str, Environment], tuple[str, ...]]:
    found: dict[str, Environment] = {}
    problems = []
    for point in sorted(entry_points(group=GROUP), key=lambda p: p.name):
        try:
            cls = point.load()
        except Exception as exc:  # a broken third-party package must not take the others down
            problems.append(
                f"entry point {point.name} ({point.value}) failed to load: {type(exc).__name__}: {exc}"
            )
            continue
        if not (isinstance(cls, type) and issubclass(cls, Environment)) or cls.name != point.name:
            problems.append(
                f"entry point {point.name} ({point.value}) is not an Environment named {point.name!r}"
            )
            continue
        if point.name in found:  # the same distribution seen twice on the path
            continue
        try:  # a part left half done, a persona a tool names and the package lacks: refused here, by name
            env = cls()
            env.personas  # noqa: B018 - loads the tools and personas, checking each against the other
        except (TypeError, ImportError, AttributeError) as exc:
            problems.append(f"entry point {point.name} ({point.value}) is not usable: {exc}")
            continue
        found[point.name] = env
    for problem in problems:
        log.warning("%s", problem)
    return found, tuple(problems)


def environments() -> dict[str, Environment]:
    """Every registered environment, by name, in name order."""
    return _loaded()[0]


def problems() -> tuple[str, ...]:
    """Entry points that could not be loaded (shown by `case-env envs`)."""
    return _loaded()[1]


def get(name: str) -> Environment:
    found = environments().get(name)
    if found is None:
        raise RegistryError(
            f"unknown environment {name!r}; registered: {', '.join(environments()) or 'none'}"
        )
    return found


def default() -> Environment:
    """The environment a command means when it names none."""
    marked = [env for env in environments().values() if env.default]
    if len(marked) == 1:
        return marked[0]
    if len(environments()) == 1:
        return next(iter(environments().values()))
    raise RegistryError(f"name an environment: {', '.join(environments())}")


def tool_owners(hosted: Iterable[Environment]) -> dict[str, str]:
    """Each tool's environment among `hosted`: a tool name belongs to exactly one."""
    owners: dict[str, str] = {}
    for env in hosted:
        for tool in env.tools:
            if owners.setdefault(tool, env.name) != env.name:
                raise RegistryError(f"tool {tool!r} is registered by both {owners[tool]} and {env.name}")
    return owners


@cache
def _tool_owners() -> dict[str, str]:
    return tool_owners(environments().values())


@cache
def _source_owners() -> dict[str, str]:
    owners: dict[str, str] = {}
    for env in environments().values():
        for source in env.personas.data_sources:
            if owners.setdefault(source, env.name) != env.name:
                raise RegistryError(
                    f"data source {source!r} is claimed by both {owners[source]} and {env.name}"
                )
    return owners


def all_tools() -> dict[str, ToolSpec]:
    """Every environment's tools, by name."""
    return {name: get(env).tools[name] for name, env in _tool_owners().items()}


@cache
def tool_parameters() -> dict[str, dict]:
    """Every tool's parameter schemas by name, for typing the values of calls read back from a transcript."""
    return {name: spec.parameters.get("properties", {}) for name, spec in all_tools().items()}


def for_tool(tool: str) -> Environment | None:
    owner = _tool_owners().get(tool)
    return get(owner) if owner else None


@cache
def row_extra() -> type[BaseModel]:
    """The part of a row's `extra_info` any reward reads, as one model: every environment's `score_extra`
    merged, `env` one of the registered names, `reward_weights` named by the components of their rewards. A row
    is checked against all of it whichever environment scores it: a malformed block is malformed wherever the
    row is routed, and /openapi.json can say exactly what /v1/score accepts. A weight of another environment's
    component is kept and not read, as that environment's block is (a recipe gives every row of a mixed bank
    the same weights); a name no reward has is refused, with the names there are."""
    environments = _loaded()[0]
    bases = tuple(dict.fromkeys(env.score_extra for env in environments.values()))
    names = Literal.__getitem__(tuple(sorted(environments)))  # type: ignore[attr-defined]
    components = sorted({c.name for env in environments.values() for c in env.components})
    weights: dict[str, Any] = {}
    if components:
        named = Literal.__getitem__(tuple(components))  # type: ignore[attr-defined]
        described = "The row's weight of each reward component it names (`case-env envs` lists them)."
        # `ScoreExtra.reward_weights`, its keys narrowed to the registered rewards' component names
        weights["reward_weights"] = (
            dict[named, Weight] | None,  # type: ignore[valid-type]
            Field(None, max_length=64, description=described),
        )
    return create_model(
        "RowExtra",
        __base__=bases,
        __doc__="A row's extra_info as the rewards read it (more keys are kept and not read).",
        env=(names | None, Field(None, description="The environment that scores the row.")),
        **weights,
    )


def own_faults(hosted: Iterable[Environment]) -> list[str]:
    """The model-fault codes the `hosted` environments name for themselves (`Evaluation.fault_codes`), in
    order."""
    return [str(c) for env in hosted for c in evaluation_of(env).fault_codes]


def model_faults() -> frozenset[str]:
    """Every code a model fault may carry: the shared ones and each environment's own."""
    return MODEL_FAULTS | frozenset(own_faults(environments().values()))


def for_row(data_source: str, extra_info: dict[str, Any] | None = None) -> Environment:
    """The environment of a row: `extra_info.env`, else its data source's, else the default one."""
    named = (extra_info or {}).get("env") if isinstance(extra_info, dict) else None
    if named:
        return get(str(named))
    owner = _source_owners().get(str(data_source))
    return get(owner) if owner else default()


def reload() -> None:
    """Forget what was found, so that a package installed since is seen (the next lookup scans again)."""
    import importlib

    importlib.invalidate_caches()
    for cached in (_loaded, _tool_owners, _source_owners, tool_parameters, row_extra):
        cached.cache_clear()
