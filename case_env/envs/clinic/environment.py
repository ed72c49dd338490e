"""The clinic environment (MedExAgent reproduced): a simulated patient to question, an exam catalogue with costs,
and a diagnosis as the final answer, under deterministic patient and exam noise."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

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
    Recipe,
    SFTRecipe,
    SynthOptions,
    TextBankOptions,
    Training,
    Variant,
)
from case_env.core.personas import Personas
from case_env.core.problems import Problems
from case_env.core.text_cases import TextCases, load_text_cases
from case_env.core.tools import Tools
from case_env.envs.clinic import bench, evaluation
from case_env.envs.clinic.context import MAX_EXCHANGES, ClinicContext, ClinicEpisode, ClinicSetup
from case_env.envs.clinic.reward import COMPONENTS, ClinicScoreExtra

if TYPE_CHECKING:
    from case_env.envs.clinic.cases import Loaded
    from case_env.envs.clinic.store import ClinicCases
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
    patient: Literal["dialogue", "ask_patient"] = Field(
        "dialogue",
        description="dialogue: MedExAgent's loop, plain text to the patient; ask_patient: verl's tool_agent, "
        "the patient as a tool.",
    )
    empty_cells: Literal["as_read", "omit"] = Field(
        "as_read",
        description="as_read: an empty field of a case table in the prompt as MedExAgent's prompt shows it "
        "(pandas reads it as NaN, printed 'nan'); omit: left out, as its builder's docstring intends.",
    )


class ClinicSynthOptions(SynthOptions):
    format: Literal["csv", "jsonl"] = Field(
        "csv", description="csv (MedExAgent's case table) or jsonl (its eval)."
    )


# MedExAgent's RL run (config/rl_config.yaml and train/rl/run.py; docs/sources.md, MedExAgent): "DAPO" there is
# GRPO with clip-higher (0.2 / 0.3), no KL term, entropy bonus 0.002, 16 samples per prompt at temperature
# 1.0, lr 1e-6, batch 64 updated once per step (ppo_mini_batch_size 64), one epoch, SGLang, a 4,096-token
# prompt and a 16,384-token response, at most 20 assistant and 15 user turns, a checkpoint every 200 steps
# and no validation (`disable_eval: true`: val_before_train False, test_freq -1), its own agent loop. The
# loop (case_env.envs.clinic.agent_loop) counts the limits as MedExAgent's does: tool-result turns and the
# patient's replies are user turns, and the user-turn limit is checked only before the patient speaks, so
# exams go on until the assistant-turn limit. Rows built with `--patient ask_patient` run under verl's
# tool_agent instead, which stops after any generation once the user turns reach the limit.
MEDEXAGENT = Recipe(
    overrides={
        "data.max_prompt_length": "4096",
        "data.max_response_length": "16384",
        "actor_rollout_ref.actor.use_kl_loss": "False",
        "actor_rollout_ref.actor.kl_loss_coef": "0.0",
        "actor_rollout_ref.actor.clip_ratio_low": "0.2",
        "actor_rollout_ref.actor.clip_ratio_high": "0.3",
        "actor_rollout_ref.actor.entropy_coeff": "0.002",
        "actor_rollout_ref.actor.optim.lr": "1e-6",
        "algorithm.use_kl_in_reward": "False",
        "actor_rollout_ref.rollout.temperature": "1.0",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": "20",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns": "15",
        "trainer.save_freq": "200",
        "trainer.test_freq": "-1",
        "trainer.val_before_train": "False",
        "trainer.max_actor_ckpt_to_keep": "null",
        "actor_rollout_ref.rollout.agent.default_agent_loop": "medexagent",
    },
    group_size=16,
    epochs=1,
    rollout="sglang",
    summary="MedExAgent's DAPO run: its loop, clip 0.2/0.3, no KL, entropy 0.002, group 16, one update/step",
    updates_per_step=1,
)


# MedExAgent's SFT stage (config/sft_config.yaml, train/sft/; docs/sources.md, MedExAgent): a full fine-tune
# (no LoRA) of Meditron3-8B, lr 2e-5 cosine with 5 % warm-up, 2 sequences per device with 2 accumulation steps,
# one epoch, bf16, sdpa attention, gradient checkpointing, sequences of 4,096 tokens (cut, not refused), the
# loss on assistant tokens, tool calls written as <tool_call> text and tool results as user turns.
MEDEXAGENT_SFT = SFTRecipe(
    overrides={
        "data.max_length": "4096",
        "data.truncation": "right",
        "data.micro_batch_size_per_gpu": "2",
        "data.use_dynamic_bsz": "False",
        "optim.lr": "2e-5",
        "optim.lr_scheduler_type": "cosine",
        "optim.lr_warmup_steps_ratio": "0.05",
        "model.enable_gradient_checkpointing": "True",
        "model.lora_rank": "0",
        "+model.override_config.attn_implementation": "sdpa",
        "trainer.total_epochs": "1",
    },
    sequences_per_gpu=4,
    summary="MedExAgent's SFT: full fine-tune, lr 2e-5 cosine, 2 x 2 per GPU, one epoch, 4,096 tokens",
)


class ClinicEnvironment(Environment, TextCases, Evaluation, Training, Benchmarks):
    name = "clinic"
    title = "clinic"
    summary = "MedExAgent: its agent loop, prompt, exam tools, reward, noise and evaluation; talk to the patient, order exams at a cost, diagnose."
    bench_mixes = bench.MIXES
    server_bench = bench.SERVER_BENCH
    tools = Tools("case_env.tools.clinic")
    personas = Personas("case_env.personas.clinic")
    context_model = ClinicSetup
    score_extra = ClinicScoreExtra
    components = COMPONENTS
    bank_options = ClinicBankOptions
    synth_options = ClinicSynthOptions
    required_extra = ("clinic", "noise", *CASE_EXTRA)
    baselines = ("clinician", "no-exam")
    loop_agent = "clinician"
    floors = ("no-exam",)
    max_turns = 20  # MedExAgent's assistant-turn limit
    figures = evaluation  # summarise, summary_lines, report
    recipes: ClassVar[dict[str, Recipe]] = {"medexagent": MEDEXAGENT}
    sft_recipes: ClassVar[dict[str, SFTRecipe]] = {"medexagent": MEDEXAGENT_SFT}
    agent_loops: ClassVar[dict[str, str]] = {"medexagent": "case_env.envs.clinic.agent_loop.MedExAgentLoop"}
    judged = True  # MedExAgent's diagnosis judge
    # the patient hears the doctor's plain text (MedExAgent's Interaction, played by ask_patient)
    listener = "ask_patient"
    said = "question"
    not_offered = "The requested exam is not available."  # MedExAgent's ToolAgent.execute
    closing = "[DIAGNOSIS: community-acquired pneumonia]"

    def ends(self, text: str) -> bool:
        from case_env.envs.clinic.reward import DIAGNOSIS_TAG

        return DIAGNOSIS_TAG.search(text or "") is not None

    def open_cases(self, data: DataSettings) -> ClinicCases:
        from case_env.envs.clinic.store import ClinicCases, ClinicSettings

        return ClinicCases.load(ClinicSettings(), data.data_root)

    def tool_context(self, cases, case_id, episode) -> ClinicContext:
        return ClinicContext(cases, case_id, episode)

    def load_cases(self, paths: list[Path]) -> Loaded:
        from case_env.envs.clinic.cases import load_cases

        return load_cases(paths)

    def describe_cases(self, cases: list) -> tuple[dict, str]:
        sources = dict(sorted(Counter(c.data_source for c in cases).items()))
        conditions = len({c.diagnosis for c in cases})
        words = f" ({', '.join(f'{k} {v}' for k, v in sources.items())}), {conditions} diagnoses"
        return {"conditions": conditions, "by_data_source": sources}, words

    def episode_context(self, settings: BaseModel, calls: Sequence[Call]) -> ClinicEpisode:
        """The patient's side of the episode so far: each answered question with the exams ordered before it,
        and the exams ordered since (MedExAgent's patient hears of every order, never of its findings)."""
        from case_env.envs.clinic.reward import as_tool
        from case_env.medicine.exams import ExamError, exam_call

        history, ordered = [], []
        for call in calls:
            if call.tool == self.listener and call.ok:
                question = str(call.arguments.get(self.said, ""))
                history.append({"question": question, "answer": call.text or "", "ordered": ordered})
                ordered = []
            elif call.ok:
                try:
                    ordered.append(exam_call(*as_tool(call.tool, call.arguments)).describe())
                except ExamError:
                    continue
        # the server's own record, already bounded when it was written: built, not validated again
        return ClinicEpisode.model_validate(
            {
                **settings.model_dump(),
                "history": history[-MAX_EXCHANGES:],
                "ordered": ordered[-MAX_EXCHANGES:],
            }
        )

    # -- banks and rewards ------------------------------------------------------------------------------
    def build_bank(self, options: BankOptions) -> BankBuild:
        from case_env.envs.clinic.bank import build
        from case_env.envs.clinic.noise import NoiseConfig

        assert isinstance(options, ClinicBankOptions)
        paths, loaded = load_text_cases(self, options)
        from case_env.envs.clinic.reward import RewardRules

        noise = NoiseConfig(
            seed=options.noise_seed,
            patient_rate=options.patient_noise,
            exam_rate=options.exam_noise,
            mode=options.noise_mode,
        )
        rules = RewardRules(profile=options.reward_profile)
        result = build(
            loaded.cases,
            options.seed,
            options.split,
            noise,
            rules,
            options.distractors,
            options.interface,
            options.patient,
            options.empty_cells,
        )
        sources = sorted({s for c in result.counts().values() for s in c})
        table = [f"{'split':6s} {'cases':>6s} " + " ".join(f"{s:>17s}" for s in sources) + f" {'noisy':>6s}"]
        for name, rows in result.rows.items():
            counts = result.counts()[name]
            noisy = sum(bool(json.loads(r["extra_info"])["noise"]["labels"]) for r in rows)
            cells = " ".join(f"{counts.get(s, 0):17d}" for s in sources)
            table.append(f"{name:6s} {len(result.cases[name]):6d} {cells} {noisy:6d}")
        meta = {
            "env": self.name,
            "seed": options.seed,
            "split": options.split,
            "cases": [str(p) for p in paths],
            "noise": noise.model_dump(),
            "reward": rules.model_dump(),
            "interface": options.interface,
            "patient": options.patient,
            "empty_cells": options.empty_cells,
            "distractors": options.distractors,
        }
        return BankBuild(result, meta, table, Problems(loaded.problems))

    async def score(self, solution_str: str, ground_truth: str, extra: ScoreExtra | Mapping | None) -> Score:
        from case_env.envs.clinic.reward import clinic_score

        return Score.of(await clinic_score(solution_str, ground_truth, extra))

    # -- data -----------------------------------------------------------------------------------------
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
        from case_env.envs.clinic.baselines import make_clinician

        if agent not in self.baselines:
            raise ValueError(f"unknown {self.title} agent {agent!r}")
        return lambda item, variant, _repeat: make_clinician(
            agent, "\n".join(m["content"] for m in item.prompt), variant.prompt
        )

    # MedExAgent's evaluation (`evaluation/runners.py`, `python -m evaluation --eval-types diagnosis
    # conversation`): 15 assistant turns, no patient persona unless asked for, no noise injected (its eval
    # files are the clean ones). `noisy` is ours: the bank's noise plan and personas, at the training turn
    # limit, because MedExAgent's evaluation never injects noise and so cannot measure robustness to it.
    protocols = ("conversation", "diagnosis", "noisy")
    eval_turns = 15

    def variants(self, item: Item, protocol: str = "") -> list[Variant]:
        clean = {"noise": {}, "persona": False}
        hidden = {"noise": {}}  # no noise plan reaches the reward or the report either
        if protocol == "noisy":
            return [Variant("noisy")]
        if protocol == "diagnosis":
            # the recorded consultation up to its diagnosis, then the model: calls run against the case,
            # a turn of plain text without a diagnosis ends it (no patient is left to answer)
            prefix = (item.extra.get("clinic") or {}).get("prefix") or None
            return [
                Variant("diagnosis", hidden, clean, prompt=prefix, max_turns=self.eval_turns, speak=False)
            ]
        return [Variant(extra=hidden, create=clean, max_turns=self.eval_turns)]

    def record_fields(self, item: Item) -> dict:
        noise = item.extra.get("noise") or {}
        return {"noise": noise.get("labels", []), "noise_plan": noise}
