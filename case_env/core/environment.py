"""The serving core: what every environment provides to be served and scored, and nothing more.

An environment is one package (its tools, its personas) with a subclass of `Environment` registered under
the entry-point group `case_env.environments`. The server, the verl adapter, the eval runner, `bank validate`,
the reward entry point and the command line reach it only through this class, its optional parts
(`case_env.core.parts`) and the registry (`case_env.core.registry`); none of them names an environment.

Thirteen members, in four groups:
- who it is: `name` (also `extra_info.env` of its rows), `title` (the word used in messages), `summary` (one
  line for `case-env envs`), `default` (the environment a command means when it names none, and the reward of
  rows that name none and whose data source no environment claims: CASE-Bench's published banks);
- what it offers: `tools` and `personas`, declared as the packages they are loaded from
  (`tools = Tools("case_env.tools.<name>")`) and read as the loaded tables;
- its cases: `open_cases(data)` (what one server worker holds), `tool_context` (how a handler sees a case);
- an episode: `context_model` (what a row sets for its episodes, from its `create_kwargs`, sent with each
  call and kept by the server at the first; None: its tools are pure functions of the arguments),
  `episode_context` (what a tool sees, built by the server from those settings and the episode's log);
- its reward: `score`, `score_extra` (the part of `extra_info` it reads, validated before it is called) and
  `components` (the reward's named terms and their default weights: `score` is their weighted sum, each
  weight the row's own when its `extra_info.reward_weights` names it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel

from case_env.core.calls import Call, ScoreExtra
from case_env.core.personas import Personas, PersonaSet
from case_env.core.tools import ToolContext, Tools, ToolSet

if TYPE_CHECKING:
    from case_env.settings import DataSettings


class Cases(Protocol):
    """An environment's cases as one server worker holds them."""

    problems: Any  # case_env.core.problems.Problems: what could not be read, with the reason

    def ids(self) -> list[str]: ...

    def __contains__(self, case_id: object) -> bool: ...

    def fingerprint(self, case_id: str) -> tuple:
        """What the response cache keys this case's answers under: changes whenever its data does."""
        ...

    def warm(self, case_id: str) -> None:
        """Prepare a case the worker sees for the first time (runs in a background thread)."""
        ...

    def memory_bytes(self) -> int:
        """Bytes of decoded data held in memory (a metric)."""
        ...


@dataclass(frozen=True)
class Component:
    """One named term of a reward: reported under `name` in the reward's dict, and counted in its `score` with
    a weight, the row's own (`extra_info.reward_weights`) or this default. A penalty's weight is negative."""

    name: str
    weight: float
    about: str


def row_weights(components: Sequence[Component], given: Mapping[str, float] | None) -> dict[str, float]:
    """Each component's weight for one row: the row's own (`extra_info.reward_weights[name]`, `given`), else
    its default. A weight of another environment's component is not read (`registry.row_extra` refuses names
    no reward has)."""
    own = given or {}
    return {c.name: float(own.get(c.name, c.weight)) for c in components}


def with_weights(extra_info: dict, weights: Mapping[str, float] | None) -> dict:
    """A row's `extra_info` with `weights` over its own reward weights (a bank built, a recipe or a run
    giving every row the same)."""
    if not weights:
        return extra_info
    return {**extra_info, "reward_weights": {**(extra_info.get("reward_weights") or {}), **weights}}


def weighted(
    components: Sequence[Component], values: Mapping[str, float], weights: Mapping[str, float]
) -> float:
    """The score: each component's value times its weight, summed in the components' order."""
    total = 0.0
    for c in components:
        total += weights[c.name] * values[c.name]
    return total


def parse_weights(text: str) -> dict[str, float]:
    """`rubric=0.5,acc=1` as {name: weight}: how a command line gives reward weights."""
    pairs = [p.partition("=") for p in text.split(",") if p.strip()]
    try:
        if any(not sep or not name.strip() for name, sep, _ in pairs):
            raise ValueError
        return {name.strip(): float(weight) for name, _, weight in pairs}
    except ValueError:
        raise ValueError(f"must be name=weight pairs such as rubric=0.5,acc=1, not {text!r}") from None


def unknown_weights(env: Environment, names: Iterable[str]) -> str | None:
    """What is wrong with weights given by name, or None: a name no component of the environment's reward
    has, with the valid ones."""
    known = [c.name for c in env.components]
    wrong = [n for n in names if n not in known]
    if not wrong:
        return None
    return (
        f"the {env.title} reward has no component {', '.join(map(repr, wrong))}; "
        f"choose among {', '.join(known) or 'none'}"
    )


@dataclass(frozen=True)
class Score:
    """A reward: the common keys every environment returns, and its own components."""

    score: float
    acc: float
    pred: str
    format_ok: bool
    components: dict[str, Any] = field(default_factory=dict)

    def flat(self) -> dict[str, Any]:
        """The dict verl's reward manager logs (one set of keys per environment, as verl requires)."""
        common = {"score": self.score, "acc": self.acc, "pred": self.pred, "format_ok": self.format_ok}
        return {**common, **self.components}

    @classmethod
    def of(cls, flat: Mapping[str, Any]) -> Score:
        common = ("score", "acc", "pred", "format_ok")
        return cls(*(flat[k] for k in common), {k: v for k, v in flat.items() if k not in common})


class Environment(ABC):
    name: ClassVar[str]
    title: ClassVar[str]
    summary: ClassVar[str]
    default: ClassVar[bool] = False
    tools: Tools | ToolSet  # declared as Tools(package); read on an instance as the loaded {name: ToolSpec}
    personas: Personas | PersonaSet  # declared as Personas(package); read as the loaded {name: PersonaSpec}
    context_model: ClassVar[type[BaseModel] | None] = None
    score_extra: ClassVar[type[ScoreExtra]] = ScoreExtra
    components: ClassVar[tuple[Component, ...]] = ()

    @abstractmethod
    def open_cases(self, data: DataSettings) -> Cases:
        """This environment's cases under the data root (or wherever its own settings point)."""

    def tool_context(self, cases: Cases, case_id: str, episode: BaseModel | None) -> ToolContext:
        return ToolContext(cases, case_id, episode)

    def episode_context(self, settings: BaseModel, calls: Sequence[Call]) -> BaseModel:
        """The context a call's tool sees, built by the server from the row's settings (`context_model`, as
        the episode's first call sent them) and the episode's calls so far, oldest first, from its own log:
        a client sends the call, never its history."""
        return settings

    @abstractmethod
    async def score(self, solution_str: str, ground_truth: str, extra: ScoreExtra | Mapping | None) -> Score:
        """The row's reward; a coroutine, so a judge's reply is awaited, holding no thread. `extra` is the
        row's `extra_info` as `reward.scorer` validated it (`score_extra` reads it without a second pass), or
        a plain caller's dict, validated by `score_extra` once."""
