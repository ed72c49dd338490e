"""The environment protocol: everything an environment package provides, and all the generic layers use.

An environment is one package (its tools in `tools/<name>/`, its personas in `personas/<name>/`) with a
subclass of `Environment` registered under the entry-point group `case_env.environments`. The server, the
verl adapter, the eval runner, `bank validate`, the reward entry point and the command line reach it only
through this class and the registry (`case_env.core.registry`); none of them names an environment.

What a subclass sets: `name` (also `extra_info.env` of its rows), `title` (in messages), `summary`, its tool
and persona packages, its per-episode context model (None: its tools are pure functions of the arguments),
its option models for bank building and synthesis, its scripted baselines. What it overrides: the hooks
below that raise NotImplementedError, and any default that does not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from case_env.core.bank import REQUIRED_EXTRA, BankResult, Item
from case_env.core.calls import ExecutedCall, ScoreExtra
from case_env.core.personas import PersonaSpec, load_personas
from case_env.core.policy import Policy
from case_env.core.problems import Problems
from case_env.core.tools import ToolContext, ToolSpec, load_tools

if TYPE_CHECKING:
    import typer

    from case_env.settings import DataSettings


class CaseStore(Protocol):
    """An environment's cases as one server worker holds them."""

    problems: Problems

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


@dataclass(frozen=True)
class Variant:
    """One way an evaluation rolls a row out. Most environments have one; case reasoning has independent
    single-turn samples and a sequential episode per case, each scored with its own settings."""

    name: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # extra_info entries the reward sees instead
    create: Mapping[str, Any] = field(default_factory=dict)  # create_kwargs the episode context sees instead
    prompt: list[dict] | None = None  # another prompt than the row's
    tools: bool = True  # offer the row's tools
    max_turns: int | None = None  # another turn budget than the environment's
    sample: int | None = None  # one of several independent samples of the row: which one


@dataclass
class DataCheck:
    """What `case-env data check` found of one environment in a data root."""

    summary: dict[str, Any]  # merged into the --json document (its keys are the environment's own)
    lines: list[str] = field(default_factory=list)  # printed to stdout
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class ReportParts:
    """An environment's part of report.html: a headline (HTML), notes, tables ((title, id, header, rows);
    the one with id `accuracy` is the one the page's self-check counts) and PNG plots."""

    headline: str
    tables: list[tuple[str, str, list[str], list[list[str]]]] = field(default_factory=list)
    plots: list[bytes] = field(default_factory=list)
    plots_title: str = "Plots"
    notes: str = ""


def _split(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value = tuple(float(x) for x in value.split(","))
        except ValueError:
            raise ValueError(f"must be three fractions such as 0.8,0.1,0.1, not {value!r}") from None
    return value


class BankOptions(BaseModel):
    """`case-env bank build` options every environment takes; an environment subclasses it with its own."""

    model_config = ConfigDict(extra="forbid")

    data_root: Path | None = Field(None, description="Data root to build the bank from.")
    out: Path = Field(description="Output directory for train/val/test parquet and patient lists.")
    seed: int = Field(0, description="Seed of question choice, distractors, letters and splits.")
    split: tuple[float, float, float] = Field(
        (0.8, 0.1, 0.1), description="train,val,test fractions of the patients."
    )

    @field_validator("split", mode="before")
    @classmethod
    def _fractions(cls, value: Any) -> Any:
        value = _split(value)
        if len(value) != 3 or any(f < 0 for f in value) or abs(sum(value) - 1) > 1e-6:
            raise ValueError(f"must be three non-negative fractions summing to 1, not {value}")
        return value


class TextBankOptions(BankOptions):
    """Banks of text environments: case files, else `<data root>/<environment>/`."""

    cases: list[Path] = Field(default_factory=list, description="Case files or directories.")


class SynthOptions(BaseModel):
    """`case-env synth` options every environment takes."""

    model_config = ConfigDict(extra="forbid")

    out: Path = Field(description="Output data root.")
    patients: int = Field(10, ge=1, le=100_000, description="Number of patients (cases).")
    seed: int = Field(0, description="Seed of all ground truth and noise.")


@dataclass(frozen=True)
class BankBuild:
    """A built bank and what its manifest (bank.json) records besides the counts."""

    result: BankResult
    meta: dict[str, Any]
    table: list[str] = field(default_factory=list)  # what the command prints
    problems: Problems = field(default_factory=Problems)  # input rows that could not be read, with the reason


PolicyFactory = Callable[[Item, Variant, int], Policy]


class Environment:
    name: ClassVar[str]
    title: ClassVar[str]
    summary: ClassVar[str]
    tools_package: ClassVar[str]
    personas_package: ClassVar[str]
    context_model: ClassVar[type[BaseModel] | None] = None
    score_extra: ClassVar[type[ScoreExtra]] = ScoreExtra  # the part of extra_info its reward reads
    bank_options: ClassVar[type[BankOptions]] = BankOptions
    synth_options: ClassVar[type[SynthOptions]] = SynthOptions
    required_extra: ClassVar[tuple[str, ...]] = ()  # extra_info keys its rows need beyond the common ones
    agents: ClassVar[tuple[str, ...]] = ()  # scripted baselines (the OpenAI-compatible agent is generic)
    loop_agent: ClassVar[str] = ""  # the baseline `case-env rollouts` plays through verl
    max_turns: ClassVar[int] = 16
    # A model's temperature for independent samples (`Variant.sample`) when the user sets none: above 0, so
    # the samples of a row differ. Every other rollout is greedy unless the user says otherwise.
    sample_temperature: ClassVar[float] = 0.6
    case_files: ClassVar[bool] = (
        False  # its cases may come from files (`--cases NAME=PATH`, CASE_ENV_<NAME>_CASES)
    )
    # The environment a command means when it names none, and the reward of rows that name no environment
    # and whose data source no environment claims (CASE-Bench's published banks carry no `env`).
    default: ClassVar[bool] = False

    # -- tools and personas -------------------------------------------------------------------------------
    @cached_property
    def tools(self) -> dict[str, ToolSpec]:
        return load_tools(self.tools_package)

    @cached_property
    def personas(self) -> dict[str, PersonaSpec]:
        return load_personas(self.personas_package, self.name, self.tools)

    @property
    def data_sources(self) -> tuple[str, ...]:
        return tuple(s for p in self.personas.values() for s in p.data_sources)

    def persona_of(self, data_source: str) -> PersonaSpec | None:
        return next((p for p in self.personas.values() if data_source in p.data_sources), None)

    # -- serving --------------------------------------------------------------------------------------
    def open_store(self, data: DataSettings) -> CaseStore:
        """This environment's cases under the data root (or wherever its own settings point)."""
        raise NotImplementedError

    def tool_context(self, store: CaseStore, patient_id: str, episode: BaseModel | None) -> ToolContext:
        return ToolContext(store, patient_id, episode)

    def episode_context(self, create: Mapping[str, Any], calls: Sequence[ExecutedCall]) -> dict | None:
        """What a call must carry besides its arguments, from the row's `create_kwargs` and the episode's
        calls so far (the server keeps no conversation state). None: nothing."""
        return None

    # Whether the server rebuilds part of a call's context from its own record of the episode (`held_context`)
    # instead of trusting what the client sent: where the context is a budget the episode spends.
    context_from_log: ClassVar[bool] = False

    def held_context(self, sent: BaseModel, calls: Sequence[ExecutedCall]) -> BaseModel:
        """The context a call runs with, given what the client `sent` and the calls the server recorded for
        the episode, oldest first."""
        return sent

    # -- banks and rewards ------------------------------------------------------------------------------
    def build_bank(self, options: BankOptions) -> BankBuild:
        raise NotImplementedError

    def score(self, solution_str: str, ground_truth: str, extra_info: dict | None) -> Score:
        raise NotImplementedError

    def check_row(self, row: dict, extra: dict) -> list[str]:
        """Problems of one row beyond the common schema (for `bank validate`)."""
        return []

    def required_keys(self) -> tuple[str, ...]:
        return (*REQUIRED_EXTRA, *self.required_extra)

    # -- data -----------------------------------------------------------------------------------------
    def check_data(self, root: Path) -> DataCheck | None:
        """`case-env data check` of this environment's part of a root; None when the root has none."""
        return None

    def synthesize(self, options: SynthOptions, echo: Callable[[str], object]) -> None:
        """Write synthetic cases, telling `echo` what was written."""
        raise NotImplementedError

    # -- evaluation -----------------------------------------------------------------------------------
    def variants(self, item: Item) -> list[Variant]:
        return [Variant()]

    def policy_factory(self, agent: str, bank: Path, seed: int) -> PolicyFactory:
        """A scripted baseline: made per rollout from (item, variant, repeat)."""
        raise ValueError(f"unknown {self.title} agent {agent!r}")

    def record_fields(self, item: Item) -> dict[str, Any]:
        """What this environment adds to a trajectory record."""
        return {}

    def summarise(self, records: list[dict]) -> dict[str, Any]:
        raise NotImplementedError

    def summary_lines(self, results: dict[str, Any]) -> list[str]:
        return []

    def report(self, runs: list[tuple[str, dict]], records: list[dict]) -> ReportParts:
        return ReportParts("")

    # -- command line ---------------------------------------------------------------------------------
    def cli(self, groups: dict[str, typer.Typer]) -> None:
        """Add this environment's own commands to the command groups (`root`, `bench`, ...)."""
