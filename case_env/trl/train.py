"""`case-env train trl sft|grpo`: CASE's two stages, supervised fine-tuning then GRPO, on TRL's trainers.

The same code runs on a CPU (a small model, as `make demo`'s model) and on GPUs with any Hugging Face causal
model: devices come from accelerate, bf16 is used where a GPU supports it, `--use-vllm` hands GRPO's generation
to vLLM (TRL's colocated mode), and `accelerate launch -m case_env.trl.train ...` spreads either stage over
GPUs. A model whose own chat template renders no tools gets case-env's template of its family and a response
schema to read its calls (`tool_ready`). Every run writes its log (`log.jsonl`), checkpoints, the final model
(`final/`) and its curves (`curve.png`: the reward, accuracy, format and calls per step), the log line by line
as the run goes and the curves at each checkpoint, so a long run on a CPU can be watched, stopped and
continued (`resume`: from the last checkpoint, its optimizer and its log); GRPO also writes every rollout
with its episode, calls and reward (`rollouts.jsonl`). `lora_rank` > 0 trains LoRA adapters (peft) on every
linear layer instead of every weight, and the final model is the merged one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from case_env.core.client import RetryPolicy


@dataclass(frozen=True)
class SFTRun:
    model: str
    data: Path  # what `case-env traj to-sft` wrote, an eval run's folder, or trajectory JSONL
    out: Path
    epochs: float = 2.0
    learning_rate: float = 5e-5
    batch_size: int = 4
    max_length: int = 4096
    seed: int = 0
    warmup_ratio: float = 0.1  # of the steps, at a rising learning rate; 0 for a run of a few steps
    checkpoints: bool = True  # a checkpoint each epoch (model and optimizer: 1.6 GB for 135 M parameters)
    # activations recomputed in the backward pass (TRL's default): off, a step of SmolLM2 takes about a quarter
    # less time, but four 2,000-token conversations then hold 17 GB
    gradient_checkpointing: bool = True
    train_layers: int = 0  # 0: every layer trained; else only the top N transformer layers (and the norm)


@dataclass(frozen=True)
class GRPORun:
    model: str
    bank: Path  # a bank parquet file
    out: Path
    server_url: str = "http://127.0.0.1:8765"
    steps: int = 20
    prompts_per_step: int = 2
    generations: int = 4
    max_completion_length: int = 512
    max_tool_calls: int = 4
    learning_rate: float = 1e-5
    temperature: float = 1.0
    beta: float = 0.0
    limit: int | None = None  # only the first N rows
    save_steps: int = 10
    seed: int = 0
    use_vllm: bool = False
    lora_rank: int = 0  # 0: every weight trained; else LoRA adapters of this rank on every linear layer
    train_layers: int = 0  # 0: every layer trained; else only the top N transformer layers (and the norm)
    resume: bool = False  # from the last checkpoint in `out`, its optimizer, log and rollouts kept
    gradient_checkpointing: bool = True  # recompute activations in the backward pass (memory for time)
    reward_weights: dict[str, float] = field(default_factory=dict)  # over every row's own


def tool_ready(tokenizer: Any, model_type: str | None) -> Any:
    """The tokenizer with a chat template that renders tools and a way to read the calls a reply makes: its
    own when TRL can use them, else case-env's template of the model's family and its response schema."""
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from case_env.lm.chat_templates import family_for, template
    from case_env.lm.prepare import RESPONSE_SCHEMA

    if supports_tool_calling(tokenizer):
        if getattr(tokenizer, "response_schema", None) is not None:
            return tokenizer
        try:
            return add_response_schema(tokenizer)
        except ValueError:  # a template TRL does not know: ours, when it is the family's
            pass
    family = family_for(model_type, str(getattr(tokenizer, "name_or_path", "")), tokenizer.get_vocab())
    if family is None:
        raise ValueError(
            f"{tokenizer.name_or_path}: its chat template renders no tools and case-env has no template for its "
            "family; give it a tool-capable template"
        )
    tokenizer.chat_template = template(family)
    tokenizer.response_schema = RESPONSE_SCHEMA
    return tokenizer


def _devices() -> dict[str, Any]:
    """bf16 where a GPU supports it; float32 on a CPU (TRL defaults to bf16 everywhere, CPUs included)."""
    import torch

    gpu = torch.cuda.is_available()
    return {"use_cpu": not gpu, "bf16": gpu and torch.cuda.is_bf16_supported()}


def _load_tokenizer(model: str) -> Any:
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return tool_ready(tokenizer, getattr(AutoConfig.from_pretrained(model), "model_type", None))


def run_sft(run: SFTRun) -> Path:
    """Supervised fine-tuning on correct trajectories (loss on the assistant's tokens); the final model's path."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from case_env.trl.data import sft_examples

    tokenizer = _load_tokenizer(run.model)
    conversations = _conversations(run.data)
    examples = sft_examples(conversations, tokenizer, run.max_length)
    if not examples:
        raise ValueError(f"no conversation of {run.data} fits in {run.max_length} tokens")
    config = SFTConfig(
        output_dir=str(run.out),
        num_train_epochs=run.epochs,
        learning_rate=run.learning_rate,
        per_device_train_batch_size=run.batch_size,
        max_length=run.max_length,
        logging_steps=1,
        save_strategy="epoch" if run.checkpoints else "no",
        save_total_limit=1,
        report_to="none",
        seed=run.seed,
        lr_scheduler_type="cosine",
        warmup_steps=run.warmup_ratio,  # a float below 1 is a share of the steps (warmup_ratio is deprecated)
        gradient_checkpointing=run.gradient_checkpointing,
        **_devices(),
    )
    trainer = SFTTrainer(
        model=_model(run.model, run.train_layers),
        args=config,
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
    )
    trainer.train()
    return _finish(trainer, tokenizer, run.out, asdict(run) | {"examples": len(examples)})


def _conversations(data: Path) -> list[dict]:
    import pyarrow.parquet as pq

    from case_env.core.sft_data import sft_rows

    rows = pq.read_table(data).to_pylist() if data.suffix == ".parquet" else list(sft_rows(data))
    return [{"messages": r["messages"], "tools": r.get("tools") or None} for r in rows]


def run_grpo(run: GRPORun) -> Path:
    """GRPO on the bank's rows against the case-env server at `server_url`; the final model's path."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from case_env.trl.data import factories, grpo_rows
    from case_env.trl.reward import case_env_reward

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = _load_tokenizer(run.model)
    env, rows, tool_sets = grpo_rows(run.bank, run.limit, run.reward_weights)
    settings = RetryPolicy(base_url=run.server_url)
    rollouts = run.out / "rollouts.jsonl"
    run.out.mkdir(parents=True, exist_ok=True)
    resume = _resumable(run.out) if run.resume else None
    if resume is None:
        rollouts.unlink(missing_ok=True)
        (run.out / "log.jsonl").unlink(missing_ok=True)
    config = GRPOConfig(
        output_dir=str(run.out),
        max_steps=run.steps,
        per_device_train_batch_size=run.prompts_per_step * run.generations,
        num_generations=run.generations,
        max_completion_length=run.max_completion_length,
        max_tool_calling_iterations=run.max_tool_calls,
        learning_rate=run.learning_rate,
        temperature=run.temperature,
        beta=run.beta,
        logging_steps=1,
        save_steps=run.save_steps,
        save_total_limit=2,
        report_to="none",
        seed=run.seed,
        use_vllm=run.use_vllm,
        vllm_mode="colocate",
        gradient_checkpointing=run.gradient_checkpointing,
        **_devices(),
    )
    trainer = GRPOTrainer(
        model=_model(run.model, run.train_layers),
        reward_funcs=[case_env_reward(tokenizer, rollouts)],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        environment_factory=factories(env, tool_sets, settings=settings),
        peft_config=_lora(run.lora_rank),
        callbacks=[_log_as_it_goes(run.out)],
    )
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return _finish(
        trainer, tokenizer, run.out, asdict(run) | {"rows": len(rows), "tool_sets": len(tool_sets)}
    )


def _model(path: str, train_layers: int) -> Any:
    """The model to train: its path, which the trainer loads, or, with `train_layers`, the model loaded with
    every weight below its top `train_layers` layers frozen: the backward pass then stops there (a step of
    SmolLM2 on a CPU is mostly that pass, docs/models.md)."""
    if train_layers <= 0:
        return path
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    layers = model.config.num_hidden_layers
    top = {f".layers.{i}." for i in range(max(0, layers - train_layers), layers)}
    for name, parameter in model.named_parameters():
        parameter.requires_grad = any(t in name for t in top) or name.startswith("model.norm")
    return model


def _lora(rank: int) -> Any:
    """LoRA adapters of `rank` on every linear layer (peft), or None: every weight trained."""
    if rank <= 0:
        return None
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear")


def _resumable(out: Path) -> Path | None:
    """The last checkpoint of a run in `out`, or None (a run begun afresh)."""
    steps = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    return steps[-1] if steps else None


def _log_as_it_goes(out: Path) -> Any:
    """A Trainer callback writing each log entry to `log.jsonl` as it comes and the curves at each save, so
    a long run's progress can be read before it ends."""
    from transformers import TrainerCallback

    class LogAsItGoes(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and state.is_world_process_zero:
                with (out / "log.jsonl").open("a", encoding="utf-8") as f:
                    f.write(json.dumps({**logs, "step": state.global_step}, default=str) + "\n")

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.is_world_process_zero:
                plot_curves([dict(e) for e in state.log_history], out / "curve.png")

    return LogAsItGoes()


def _finish(trainer: Any, tokenizer: Any, out: Path, settings: dict) -> Path:
    """The final model (LoRA adapters merged into it) and tokenizer, the log and its curves."""
    final = out / "final"
    model = trainer.model
    if hasattr(model, "merge_and_unload"):  # a peft model: the checkpoint a plain loader reads
        model = model.merge_and_unload()
    model.save_pretrained(str(final))
    tokenizer.save_pretrained(str(final))
    log = [dict(entry) for entry in trainer.state.log_history]
    with (out / "log.jsonl").open("w", encoding="utf-8") as f:
        f.write(json.dumps({"settings": settings}, default=str) + "\n")
        for entry in log:
            f.write(json.dumps(entry) + "\n")
    plot_curves(log, out / "curve.png")
    return final


CURVES = (
    ("reward", "reward"),
    ("case_env/acc", "accuracy"),
    ("case_env/format_ok", "format ok"),
    ("case_env/tool_calls", "tool calls"),
    ("case_env/calls_ok", "calls accepted"),
    ("loss", "loss"),
)


def plot_curves(log: list[dict], path: Path) -> None:
    """Each logged figure against the step, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [(key, label) for key, label in CURVES if any(key in e for e in log)]
    if not present:
        return
    fig, axes = plt.subplots(1, len(present), figsize=(3.2 * len(present), 3.0), squeeze=False)
    for ax, (key, label) in zip(axes[0], present, strict=True):
        points = [(e["step"], e[key]) for e in log if key in e and "step" in e]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
