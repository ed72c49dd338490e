"""The optional parts of an environment: what some environments have and the generic layers use when they do.

The serving core (`case_env.core.environment.Environment`) is what every environment needs to be served and
scored. Everything else is one of five parts here (`Data`, `Evaluation`, `Training`, `Benchmarks`,
`Commands`; `TextCases` in core/text_cases.py is the sixth), each a class an environment subclasses beside
`Environment` when it has one (`class ClinicEnvironment(Environment, TextCases, Data, Evaluation, ...)`). A
generic layer asks `isinstance(env, Data)` ("does it have one") and says what is missing when it has not;
inside a part, what is optional has a default that means "none" (no generator, no baselines, no dialogue). An
environment that declares a part but leaves a method out that its settings need (`synth_options` without
`synthesize`, say) fails when the registry loads it, not when a command first calls the method.

The table of parts, their members and the commands that use them is `registry.parts_table()` (in
docs/architecture.md).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from case_env.core.bank import BankResult, Item
from case_env.core.policy import Policy
from case_env.core.problems import Problems

if TYPE_CHECKING:
    import typer


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
    # in a row whose loop is a conversation (`Training.listener`): plain text goes to the listener; False: it
    # ends the episode (a protocol that plays a recorded conversation's end, with no one left to answer)
    speak: bool = True


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
    out: Path = Field(description="Output directory for train/val/test parquet and case lists.")
    seed: int = Field(0, description="Seed of question choice, distractors, letters and splits.")
    split: tuple[float, float, float] = Field(
        (0.8, 0.1, 0.1), description="train,val,test fractions of the cases."
    )
    reward_weights: dict[str, float] = Field(
        default_factory=dict,
        description="Weights of the reward's components in every row, as name=weight,... (`case-env envs` "
        "lists them); the others keep their default.",
    )

    @field_validator("reward_weights", mode="before")
    @classmethod
    def _weights(cls, value: Any) -> Any:
        from case_env.core.environment import parse_weights

        return parse_weights(value) if isinstance(value, str) else value

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


class Data(ABC):
    """Its banks (`case-env bank build` takes its options from `bank_options`), its part of `case-env data
    check`, and a synthetic generator when `synth_options` is set (`case-env synth --env NAME`)."""

    bank_options: ClassVar[type[BankOptions]] = BankOptions
    required_extra: ClassVar[tuple[str, ...]] = ()  # extra_info keys its rows need beyond the common ones
    synth_options: ClassVar[type[SynthOptions] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.synth_options is not None and cls.synthesize is Data.synthesize:
            raise TypeError(f"{cls.__name__} sets synth_options but defines no synthesize")

    @abstractmethod
    def build_bank(self, options: BankOptions) -> BankBuild: ...

    def check_row(self, row: dict, extra: dict) -> list[str]:
        """Problems of one row beyond the common schema (for `bank validate`)."""
        return []

    def check_data(self, root: Path) -> DataCheck | None:
        """`case-env data check` of this environment's part of a root; None when the root has none."""
        return None

    def synthesize(self, options: SynthOptions, echo: Callable[[str], object]) -> None:
        """Write synthetic cases, telling `echo` what was written."""
        raise NotImplementedError(f"{type(self).__name__} has no synthetic generator")


class Evaluation:
    """How `case-env eval` rolls rows out and summarises them (without the part, each row once and the mean
    reward), its scripted baselines and the model-fault codes its tools name."""

    # Scripted baselines (`case-env eval --agent NAME`, made by `policy_factory`); `loop_agent` is the one
    # `case-env rollouts` plays through verl's agent loop. Not verl's `agent_name`, which names a row's loop.
    baselines: ClassVar[tuple[str, ...]] = ()
    loop_agent: ClassVar[str] = ""
    # baselines a model must beat to show it uses what it is given (a guess, no tools): `rollouts --model`
    # plays them on the model's rows
    floors: ClassVar[tuple[str, ...]] = ()
    # codes of model faults it names for itself (a `ToolError` may carry any string; these are the ones
    # /openapi.json lists beside the shared `ErrorCode`s)
    fault_codes: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.baselines and cls.policy_factory is Evaluation.policy_factory:
            raise TypeError(f"{cls.__name__} names baselines but defines no policy_factory")

    def policy_factory(self, agent: str, bank: Path, seed: int) -> PolicyFactory:
        """A scripted baseline: made per rollout from (item, variant, repeat)."""
        raise ValueError(f"{type(self).__name__} has no scripted agent {agent!r}")

    max_turns: ClassVar[int] = 16
    # A model's temperature for independent samples (`Variant.sample`) when the user sets none: above 0, so
    # the samples of a row differ. Every other rollout is greedy unless the user says otherwise.
    sample_temperature: ClassVar[float] = 0.6

    # Named ways to evaluate a row (`case-env eval --protocol`), the first the default; none: one way.
    protocols: ClassVar[tuple[str, ...]] = ()

    def variants(self, item: Item, protocol: str = "") -> list[Variant]:
        return [Variant()]

    def record_fields(self, item: Item) -> dict[str, Any]:
        """What this environment adds to a trajectory record."""
        return {}

    # The environment's evaluation module, when its figures are plain functions of the records there:
    # `summarise(records)`, `summary_lines(results)` and `report(runs, records)`.
    figures: ClassVar[Any] = None

    def summarise(self, records: list[dict]) -> dict[str, Any]:
        if self.figures:
            return self.figures.summarise(records)
        n = len(records)
        accuracy = round(sum(float(r.get("reward", 0.0)) for r in records) / n, 4) if n else 0.0
        return {"overall": {"n": n, "accuracy": accuracy}}

    def summary_lines(self, results: dict[str, Any]) -> list[str]:
        if self.figures:
            return self.figures.summary_lines(results)
        overall = results["overall"]
        return [f"overall {overall['n']} accuracy {overall['accuracy']:.3f}"]

    def report(self, runs: list[tuple[str, dict]], records: list[dict]) -> ReportParts:
        return self.figures.report(runs, records) if self.figures else ReportParts("")


_PLAIN = Evaluation()


def evaluation_of(env: object) -> Evaluation:
    """The environment's `Evaluation` part, else the plain one: `eval`, its report and its summary agree."""
    return env if isinstance(env, Evaluation) else _PLAIN


# One episode's calls, (tool, arguments), drawn with the generator it is given.
# one episode's calls: (tool, arguments) or (tool, arguments, episode context)
Plan = Callable[
    [random.Random], list[tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], dict[str, Any]]]
]


@dataclass(frozen=True)
class ServerBench:
    """`case-env bench server` for an environment whose tools or reward ask a language model, played against
    a loopback stand-in of that model (`case_env.bench.standin`, `case_env.bench.model_server`)."""

    cases: Callable[[Path], dict[str, str]]  # writes bench cases under a directory: the server's settings
    model_setting: str  # the variable naming the endpoint its tools ask (the stand-in's URL goes there)
    concurrency_setting: str  # the variable bounding requests in flight to it, per server worker
    model_reply: str  # what the stand-in answers its tools
    rewards: Callable[
        [int], list[tuple[str, str, str, dict]]
    ]  # n rows to score: source, response, truth, extra
    judge_reply: str  # what the stand-in judge answers its reward
    # episode i of a burst: its first call, one that waits on the model and that no other episode shares
    first_call: Callable[[int], tuple[str, dict[str, Any]]]


class Benchmarks:
    """Call mixes (name -> `Plan`) the shared load generator (`case_env.bench.load`) plays against this
    environment's tools; `server_bench` when `case-env bench server --env NAME` runs the generic benchmark of
    tools and rewards that wait on a model (an environment with a benchmark of its own overrides
    `bench_server`)."""

    bench_mixes: ClassVar[Mapping[str, Plan]] = {}
    server_bench: ClassVar[ServerBench | None] = None

    def bench_server(self, options: ServerBenchOptions, echo: Callable[[str], object]) -> dict | None:
        """An environment's own `case-env bench server`, returning its figures; None (the default) runs the
        generic benchmark of `server_bench` (`case_env.bench.model_server.bench_server`)."""
        return None


class ServerBenchOptions(BaseModel):
    """`case-env bench server`'s options (the command is built from them): the shared ones, then those of
    one kind of benchmark (None: not given; an environment refuses options it has no use for, by name)."""

    model_config = ConfigDict(extra="forbid")

    out: Path = Field(
        Path("bench-out/server"),
        description="Directory for bench.json (bench-out/server-ENV for an environment other than the default).",
    )
    rollouts: int = Field(
        256,
        ge=1,
        description="Concurrent virtual rollouts (1024 where tools wait on a model: a training step's).",
    )
    duration: float = Field(20.0, ge=1, description="Measured seconds per load (after warm-up).")
    warmup: float = Field(5.0, ge=0, description="Unmeasured seconds first (caches fill).")
    workers: int = Field(2, ge=1, description="Server worker processes.")
    think_ms: float = Field(
        0.0, ge=0, description="Mean model time before each call (exponential); 0: closed loop."
    )
    group_size: int = Field(
        1, ge=1, description="Rollouts per GRPO group sharing case and calls (1: independent)."
    )
    runs: int = Field(1, ge=1, description="Repeat the whole benchmark (figures of every run).")
    # the benchmark of an environment served from a data root
    data_root: Path | None = Field(
        None,
        description="The data root, generated there once if missing, then reused (when none: data/bench).",
    )
    baseline: str | None = Field(
        None,
        description="Baselines beside case-env, comma-separated: naive (the naive data engine), openenv "
        "(OpenEnv's app factory; the openenv extra), floor (a bare Starlette route).",
    )
    cache_mb: int | None = Field(
        None, ge=0, description="Decoded-data cache budget per worker (when none: the server's own)."
    )
    doors: str | None = Field(
        None, description="Doors measured beside the tool API on one worker, comma-separated: openenv, mcp."
    )
    stores: str | None = Field(
        None,
        description="Episode stores measured in turns, comma-separated: sqlite, redis (when none: sqlite).",
    )
    # a model-waiting benchmark
    model_latency_ms: str | None = Field(
        None, description="The stand-in model's latencies in ms, comma-separated (when none: 0,300,2000)."
    )
    model_failure_rate: float | None = Field(
        None, ge=0, le=1, description="Share of the stand-in's requests answered 500 (when none: 0)."
    )
    rewards: int | None = Field(None, ge=1, description="Rows of the reward batch (when none: 1024).")
    judge_latency_ms: float | None = Field(
        None, ge=0, description="The stand-in judge's latency for the reward batch (when none: 500)."
    )

    @field_validator("model_latency_ms")
    @classmethod
    def _numbers(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                [float(v) for v in value.split(",")]
            except ValueError:
                raise ValueError(f"takes numbers separated by commas, not {value!r}") from None
        return value

    @property
    def latencies(self) -> list[float] | None:
        """`model_latency_ms` as numbers."""
        return [float(v) for v in self.model_latency_ms.split(",")] if self.model_latency_ms else None

    def refuse(self, env: str, unused: Sequence[str]) -> None:
        """A ValueError naming the options given that `env`'s benchmark has no use for."""
        given = [name for name in unused if getattr(self, name) is not None]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"the {env} server benchmark takes no {flags}")


@dataclass(frozen=True)
class Recipe:
    """A training recipe: the verl overrides that differ from the launcher's base recipe, and the defaults
    of the launcher's own options (samples per prompt, epochs, inference engine)."""

    overrides: Mapping[str, str]
    group_size: int
    epochs: int
    rollout: str
    summary: str  # one line for --help
    updates_per_step: int = 4  # PPO mini-batches per step: ppo_mini_batch_size = batch size / this
    # on-policy self-distillation from the rows' teacher_insight (case_env/verl/distill.py); --opsd/--no-opsd
    opsd: bool = False
    # the weights it gives its environment's reward components in every row (over the bank's own), as verl's
    # dataset loads them (`+data.reward_weights.<name>`): CASE's rubric for its RLAIF recipes, say
    reward_weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SFTRecipe:
    """A supervised stage before RL on verl's SFT trainer: its overrides of verl's `sft_trainer_engine`, the
    sequences each GPU takes per optimizer step (micro-batches times accumulation), and how a conversation's
    tool calls are written."""

    overrides: Mapping[str, str]
    sequences_per_gpu: int
    summary: str
    tools_as_text: bool = True  # calls as <tool_call> text, results as user turns, no tool schemas


class Training:
    """How it trains: recipes of its own beside the launcher's base one (`case-env train run --recipe NAME`)
    and supervised stages (`scripts/train_sft.sh --recipe NAME`); verl agent loops of its own; whether its
    reward asks the judge; and, when `listener` is set, episodes that are conversations."""

    recipes: ClassVar[Mapping[str, Recipe]] = {}
    sft_recipes: ClassVar[Mapping[str, SFTRecipe]] = {}
    # verl agent loops (`AgentLoopBase` subclasses, by dotted class path), which its bank rows name in
    # `agent_name`; the launcher lists them in the file `rollout.agent.agent_loop_config_path` points to
    agent_loops: ClassVar[Mapping[str, str]] = {}
    # Its reward may ask the language-model judge (`CASE_ENV_JUDGE_URL`, `core.llm.default_judge`): a run with
    # a judge configured gets verl's rate-limited reward manager, which awaits the coroutine reward.
    judged: ClassVar[bool] = False
    rule_graded: ClassVar[str] = ""  # the CASE_ENV_* setting that runs its reward without a judge
    # A conversation, in the manner of a consultation: a turn without a tool call is said to someone the server
    # plays (the `listener` tool answers it, the text as its `said` argument) and the reply comes back as a
    # user turn; every tool call of a turn runs; a turn for which `ends` holds closes the episode.
    listener: ClassVar[str] = ""
    said: ClassVar[str] = ""
    # what a call of a tool the row does not offer gets back (the server is not called)
    not_offered: ClassVar[str] = "This tool is not available."
    # a final turn's answer in the environment's own form (rehearsals end with it)
    closing: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.listener and cls.ends is Training.ends:
            raise TypeError(f"{cls.__name__} names a listener but defines no ends")

    def asks_judge(self, settings: Mapping[str, str], weights: Mapping[str, float]) -> bool:
        """Whether its reward asks the judge under the workers' `CASE_ENV_*` settings and the run's reward
        weights (a weight that turns the judged part on, say)."""
        return self.judged

    def ends(self, text: str) -> bool:
        """Whether a conversation's turn closes the episode."""
        return False


def dialogue_of(env: object, agent_name: str | None) -> Training | None:
    """The environment's conversation rules when a row's agent loop is one of the environment's own, else None
    (verl's stock loops end an episode at the first reply without a tool call)."""
    if isinstance(env, Training) and env.listener and agent_name in env.agent_loops:
        return env
    return None


class Commands(ABC):
    """Commands of its own, added to the command line's groups."""

    @abstractmethod
    def cli(self, groups: dict[str, typer.Typer]) -> None:
        """Add this environment's own commands to the command groups (`root`, `bench`, ...)."""
