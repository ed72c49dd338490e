"""The case-reasoning environment (MedCaseReasoning reproduced): a long case presentation, reasoning in <think>, a
judged diagnosis in <answer>, k attempts, and recall of the clinician's reasoning statements."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from case_env.core.bank import CASE_EXTRA, Item
from case_env.core.calls import Call, ScoreExtra
from case_env.core.environment import Environment, Score
from case_env.core.parts import (
    BankBuild,
    BankOptions,
    Benchmarks,
    Evaluation,
    PolicyFactory,
    SynthOptions,
    TextBankOptions,
    Training,
    Variant,
)
from case_env.core.personas import Personas
from case_env.core.problems import Problems
from case_env.core.text_cases import TextCases, load_text_cases
from case_env.core.tools import Tools
from case_env.envs.casereason import bench, evaluation
from case_env.envs.casereason.context import MAX_ATTEMPTS, ReasoningContext, ReasoningEpisode, ReasoningSetup
from case_env.envs.casereason.reward import COMPONENTS, ReasoningScoreExtra

if TYPE_CHECKING:
    from case_env.envs.casereason.cases import Loaded
    from case_env.envs.casereason.store import ReasoningCases
    from case_env.settings import DataSettings


class ReasoningBankOptions(TextBankOptions):
    mode: Literal["independent", "sequential"] = Field(
        "independent", description="independent (single turn) or sequential (submit_diagnosis)."
    )
    attempts: int = Field(10, ge=1, le=64, description="Attempts k (sequential).")
    extraction: Literal["strict", "reference"] = Field(
        "strict",
        description="How the reward reads the answer in training: strict (the last <answer>, written last) "
        "or reference (MedCaseReasoning's harness: the first <answer>, else the whole reply).",
    )
    eval_extraction: Literal["strict", "reference"] = Field(
        "reference", description="How case-env eval reads the answer (default: as the harness does)."
    )


class CaseReasonEnvironment(Environment, TextCases, Evaluation, Training, Benchmarks):
    name = "casereason"
    title = "case-reasoning"
    summary = (
        "MedCaseReasoning: long case presentations, its judge and harness, k attempts, reasoning recall."
    )
    bench_mixes = bench.MIXES
    server_bench = bench.SERVER_BENCH
    tools = Tools("case_env.tools.casereason")
    personas = Personas("case_env.personas.casereason")
    context_model = ReasoningSetup
    score_extra = ReasoningScoreExtra
    components = COMPONENTS
    bank_options = ReasoningBankOptions
    required_extra = ("casereason", *CASE_EXTRA)
    synth_options = SynthOptions
    judged = True  # MedCaseReasoning's yes/no judge
    baselines = ("reader", "symptoms")
    loop_agent = "reader"
    max_turns = evaluation.ATTEMPTS + 2
    figures = evaluation  # summarise, summary_lines, report

    def open_cases(self, data: DataSettings) -> ReasoningCases:
        from case_env.envs.casereason.store import CaseReasonSettings, ReasoningCases

        return ReasoningCases.load(CaseReasonSettings(), data.data_root)

    def tool_context(self, cases, case_id, episode) -> ReasoningContext:
        return ReasoningContext(cases, case_id, episode)

    def load_cases(self, paths: list[Path]) -> Loaded:
        from case_env.envs.casereason.cases import load_cases

        return load_cases(paths)

    def describe_cases(self, cases: list) -> tuple[dict, str]:
        diagnoses = len({c.diagnosis for c in cases})
        return {"diagnoses": diagnoses}, f", {diagnoses} diagnoses"

    # the attempt budget is spent on the server's own count of the episode's judged submissions
    def episode_context(self, settings: BaseModel, calls: Sequence[Call]) -> ReasoningEpisode:
        return ReasoningEpisode(**settings.model_dump(), submissions=_submitted(calls)[:MAX_ATTEMPTS])

    # -- banks and rewards ------------------------------------------------------------------------------
    def build_bank(self, options: BankOptions) -> BankBuild:
        from case_env.envs.casereason.bank import build

        assert isinstance(options, ReasoningBankOptions)
        paths, loaded = load_text_cases(self, options)
        result = build(
            loaded.cases,
            options.seed,
            options.split,
            options.mode,
            options.attempts,
            (options.extraction, options.eval_extraction),
        )
        k = options.attempts if options.mode == "sequential" else 1
        table = [
            f"{name:6s} {len(rows):6d} cases ({options.mode}, k={k})" for name, rows in result.rows.items()
        ]
        meta = {
            "env": self.name,
            "seed": options.seed,
            "split": options.split,
            "mode": options.mode,
            "attempts": options.attempts,
            "cases": [str(p) for p in paths],
        }
        return BankBuild(result, meta, table, Problems(loaded.problems))

    async def score(self, solution_str: str, ground_truth: str, extra: ScoreExtra | Mapping | None) -> Score:
        from case_env.envs.casereason.reward import casereason_score

        return Score.of(await casereason_score(solution_str, ground_truth, extra))

    # -- data -----------------------------------------------------------------------------------------
    def synthesize(self, options: SynthOptions, echo: Callable[[str], object]) -> None:
        from case_env.envs.casereason.synth import write_cases

        path = options.out / self.name / "casereason_synthetic.jsonl"
        rows = write_cases(options.patients, options.seed, path)
        echo(f"wrote {len(rows)} case-reasoning cases (seed {options.seed}) to {path}")

    # -- evaluation -----------------------------------------------------------------------------------
    def variants(self, item: Item, protocol: str = "") -> list[Variant]:
        return evaluation.variants(item)

    def policy_factory(self, agent: str, bank: Path, seed: int) -> PolicyFactory:
        from case_env.envs.casereason.baselines import SampleReader, SequentialReader, make_reader

        if agent not in self.baselines:
            raise ValueError(f"unknown {self.title} agent {agent!r}")

        def make(item: Item, variant: Variant, repeat: int):
            reader = make_reader(agent, item.extra["patient_id"], item.prompt[-1]["content"])
            if variant.sample is not None:
                return SampleReader(reader, evaluation.sample_index(variant, repeat, seed))
            attempts = int(
                variant.create.get("attempts") or (item.extra.get("casereason") or {}).get("attempts", 1)
            )
            if variant.name == evaluation.SEQUENTIAL or attempts > 1:
                return SequentialReader(reader, attempts)
            return SampleReader(reader, 0)  # the row as it is, single turn

        return make


def _submitted(calls: Sequence[Call]) -> list[str]:
    """The diagnoses an episode submitted and had judged, oldest first."""
    return [str(c.arguments.get("diagnosis", "")) for c in calls if c.tool == "submit_diagnosis" and c.ok]
