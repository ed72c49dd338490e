"""The clinic environment (MedExAgent reproduced): a simulated patient to question, an exam catalogue with costs,
and a diagnosis as the final answer, under deterministic patient and exam noise."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from case_env.core.bank import Item
from case_env.core.calls import ExecutedCall
from case_env.core.environment import (
    BankBuild,
    BankOptions,
    DataCheck,
    Environment,
    PolicyFactory,
    ReportParts,
    Score,
    SynthOptions,
    TextBankOptions,
)
from case_env.core.problems import Problems
from case_env.core.store import check_case_files, load_text_cases
from case_env.envs.clinic import evaluation
from case_env.envs.clinic.context import ClinicContext, ClinicEpisode
from case_env.envs.clinic.reward import ClinicScoreExtra

if TYPE_CHECKING:
    from case_env.envs.clinic.store import ClinicStore
    from case_env.settings import DataSettings


class ClinicBankOptions(TextBankOptions):
    patient_noise: float = Field(0.0, ge=0, le=1, description="Share of noisy patients.")
    exam_noise: float = Field(0.0, ge=0, le=1, description="Share of noisy exam results.")
    noise_seed: int = Field(42, description="Seed of the noise draws.")
    noise_mode: Literal["dataset", "per_case"] = Field(
        "dataset", description="dataset: MedExAgent's dataset-wide assignment; per_case: a draw per case."
    )
    reward_profile: Literal["medexagent", "strict"] = Field(
        "medexagent", description="medexagent: its published reward; strict: every exam costs, as it ran."
    )
    interface: Literal["exam_tools", "order_exam"] = Field(
        "exam_tools", description="exam_tools: MedExAgent's one tool per exam; order_exam: one tool."
    )
    distractors: int = Field(5, ge=0, le=60, description="Exam tools offered beside the work-up's.")


class ClinicSynthOptions(SynthOptions):
    format: Literal["csv", "jsonl"] = Field(
        "csv", description="csv (MedExAgent's case table) or jsonl (its eval)."
    )


class ClinicEnvironment(Environment):
    name = "clinic"
    title = "clinic"
    summary = "MedExAgent: its exam tools, reward and noise; ask the patient, order exams at a cost, diagnose, under patient and exam noise."
    tools_package = "case_env.tools.clinic"
    personas_package = "case_env.personas.clinic"
    context_model = ClinicEpisode
    score_extra = ClinicScoreExtra
    bank_options = ClinicBankOptions
    synth_options = ClinicSynthOptions
    required_extra = ("clinic", "noise")
    agents = ("clinician", "no-exam")
    loop_agent = "clinician"
    case_files = True
    max_turns = 20  # MedExAgent's assistant-turn limit

    def open_store(self, data: DataSettings) -> ClinicStore:
        from case_env.envs.clinic.store import ClinicSettings, ClinicStore

        return ClinicStore.load(ClinicSettings(), data.data_root)

    def tool_context(self, store, patient_id, episode) -> ClinicContext:
        return ClinicContext(store, patient_id, episode)

    def episode_context(self, create: Mapping[str, Any], calls: Sequence[ExecutedCall]) -> dict:
        history = [
            {"question": str(c.arguments.get("question", "")), "answer": c.text or ""}
            for c in calls
            if c.tool == "ask_patient" and c.ok
        ]
        return {"noise": dict(create.get("noise") or {}), "history": history}

    # -- banks and rewards ------------------------------------------------------------------------------
    def build_bank(self, options: BankOptions) -> BankBuild:
        from case_env.envs.clinic.bank import build
        from case_env.envs.clinic.cases import load_cases
        from case_env.envs.clinic.noise import NoiseConfig

        assert isinstance(options, ClinicBankOptions)
        paths, loaded = load_text_cases(self, load_cases, options)
        from case_env.envs.clinic.reward import RewardWeights

        noise = NoiseConfig(
            seed=options.noise_seed,
            patient_rate=options.patient_noise,
            exam_rate=options.exam_noise,
            mode=options.noise_mode,
        )
        weights = RewardWeights(profile=options.reward_profile)
        result = build(
            loaded.cases, options.seed, options.split, noise, weights, options.distractors, options.interface
        )
        sources = sorted({s for c in result.counts().values() for s in c})
        table = [f"{'split':6s} {'cases':>6s} " + " ".join(f"{s:>17s}" for s in sources) + f" {'noisy':>6s}"]
        for name, rows in result.rows.items():
            counts = result.counts()[name]
            noisy = sum(bool(json.loads(r["extra_info"])["noise"]["labels"]) for r in rows)
            cells = " ".join(f"{counts.get(s, 0):17d}" for s in sources)
            table.append(f"{name:6s} {len(result.patients[name]):6d} {cells} {noisy:6d}")
        meta = {
            "env": self.name,
            "seed": options.seed,
            "split": options.split,
            "cases": [str(p) for p in paths],
            "noise": noise.model_dump(),
            "reward": weights.model_dump(),
            "interface": options.interface,
            "distractors": options.distractors,
        }
        return BankBuild(result, meta, table, Problems(loaded.problems))

    def score(self, solution_str: str, ground_truth: str, extra_info: dict | None) -> Score:
        from case_env.envs.clinic.reward import clinic_score

        return Score.of(clinic_score(solution_str, ground_truth, extra_info))

    # -- data -----------------------------------------------------------------------------------------
    def check_data(self, root: Path) -> DataCheck | None:
        from case_env.envs.clinic.cases import load_cases

        def describe(cases: list) -> tuple[dict, str]:
            sources = dict(sorted(Counter(c.data_source for c in cases).items()))
            conditions = len({c.diagnosis for c in cases})
            words = f" ({', '.join(f'{k} {v}' for k, v in sources.items())}), {conditions} diagnoses"
            return {"conditions": conditions, "by_data_source": sources}, words

        return check_case_files(self, load_cases, root, describe)

    def synthesize(self, options: SynthOptions, echo: Callable[[str], object]) -> None:
        from case_env.envs.clinic.synth import make_cases, write_csv, write_jsonl

        assert isinstance(options, ClinicSynthOptions)
        path = options.out / self.name / f"clinic_synthetic.{options.format}"
        made = make_cases(options.patients, options.seed)
        (write_csv if options.format == "csv" else write_jsonl)(made, path)
        conditions = len({c.diagnosis for c in made})
        echo(f"wrote {len(made)} clinic cases ({conditions} conditions, seed {options.seed}) to {path}")

    # -- evaluation -----------------------------------------------------------------------------------
    def policy_factory(self, agent: str, bank: Path, seed: int) -> PolicyFactory:
        from case_env.envs.clinic.agents import make_clinician

        if agent not in self.agents:
            return super().policy_factory(agent, bank, seed)
        return lambda item, _variant, _repeat: make_clinician(
            agent, "\n".join(m["content"] for m in item.prompt)
        )

    def record_fields(self, item: Item) -> dict:
        noise = item.extra.get("noise") or {}
        return {"noise": noise.get("labels", []), "noise_plan": noise}

    def summarise(self, records: list[dict]) -> dict:
        return evaluation.summarise(records)

    def summary_lines(self, results: dict) -> list[str]:
        return evaluation.summary_lines(results)

    def report(self, runs: list[tuple[str, dict]], records: list[dict]) -> ReportParts:
        return evaluation.report(runs, records)
