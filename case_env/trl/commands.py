"""`case-env train trl sft|grpo` and `case-env model prepare`: the command line of the model extra. Imports
nothing heavy until a command runs."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import NoReturn

import typer

from case_env.core.environment import parse_weights
from case_env.core.errors import CommandError

trl_app = typer.Typer(
    help="CASE's two stages on TRL's trainers, on a CPU or GPUs: sft, then grpo (needs the model extra).",
    no_args_is_help=True,
)
model_app = typer.Typer(help="Language models on this machine (needs the model extra).", no_args_is_help=True)


def _refuse(message: str) -> NoReturn:
    raise CommandError(message, 2)


def model_dir(model: str) -> str:
    """A model directory: `model` itself, or a known model prepared on first use; a clear error otherwise."""
    try:
        from case_env.lm.prepare import ModelError, resolve
    except ImportError as exc:
        _refuse(f"this needs the model extra ({exc.name} is missing): pip install 'case-env[model]'")
    try:
        return str(resolve(model))
    except ModelError as exc:
        _refuse(str(exc))


def _quiet_hub() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # nothing to send from a training run
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@model_app.command("prepare")
def prepare(name: str = typer.Argument("smollm2", help="A known model [default: smollm2].")) -> None:
    """Prepare a known model once as a Hugging Face directory in the cache; prints its path."""
    typer.echo(model_dir(name))


@trl_app.command("sft")
def sft(
    model: str = typer.Option(..., "--model", help="A Hugging Face model directory or id, or smollm2."),
    data: Path = typer.Option(
        ..., "--data", help="Trajectories: `case-env traj to-sft`'s parquet, an eval --out folder or JSONL."
    ),
    out: Path = typer.Option(..., "--out", help="Run directory: checkpoints, final/, log.jsonl, curve.png."),
    epochs: float = typer.Option(
        2.0, "--epochs", min=0.01, help="Passes over the trajectories [default: 2]."
    ),
    learning_rate: float = typer.Option(5e-5, "--lr", min=0.0, help="Peak learning rate [default: 5e-05]."),
    batch_size: int = typer.Option(4, "--batch-size", min=1, help="Conversations per step [default: 4]."),
    max_length: int = typer.Option(
        4096, "--max-length", min=64, help="Longest conversation kept [default: 4096]."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed [default: 0]."),
    train_layers: int = typer.Option(
        0, "--train-layers", min=0, help="Train only the top N transformer layers; 0 trains all [default: 0]."
    ),
) -> None:
    """Supervised fine-tuning on correct trajectories, the loss on the assistant's tokens (CASE's first stage)."""
    from case_env.trl.train import SFTRun, run_sft

    _quiet_hub()
    if not data.exists():
        _refuse(f"{data} does not exist: export trajectories with `case-env traj to-sft`")
    path = model_dir(model)
    run = SFTRun(
        path, data, out, epochs, learning_rate, batch_size, max_length, seed, train_layers=train_layers
    )
    final = run_sft(run)
    typer.echo(f"wrote {final} ({out / 'curve.png'}, {out / 'log.jsonl'})")


def _checked_weights(bank: Path, server_url: str, limit: int | None, reward_weights: str) -> dict[str, float]:
    """GRPO's cheap checks, before a model loads: the bank, the server, the rows and the weights' names."""
    from case_env.server.control import reachable
    from case_env.trl.data import grpo_rows

    if not bank.is_file():
        _refuse(f"{bank} is not a bank parquet file (e.g. data/bank/train.parquet)")
    if not reachable(server_url):
        _refuse(f"no case-env server answers at {server_url}: start one with `case-env serve`")
    try:
        weights = parse_weights(reward_weights)
    except ValueError as exc:
        _refuse(f"--reward-weights {exc}")
    try:
        grpo_rows(bank, limit, weights)
    except ValueError as exc:
        _refuse(str(exc))
    return weights


@trl_app.command("grpo")
def grpo(
    model: str = typer.Option(..., "--model", help="A Hugging Face model directory or id, or smollm2."),
    bank: Path = typer.Option(..., "--bank", help="A bank parquet file (its rows are the prompts)."),
    out: Path = typer.Option(..., "--out", help="Run directory: checkpoints, final/, log.jsonl, curve.png."),
    server_url: str = typer.Option(
        "http://127.0.0.1:8765", "--server-url", help="The case-env server holding the bank's cases."
    ),
    steps: int = typer.Option(20, "--steps", min=1, help="Optimiser steps [default: 20]."),
    prompts_per_step: int = typer.Option(2, "--prompts", min=1, help="Rows per step [default: 2]."),
    generations: int = typer.Option(
        4, "--generations", min=2, help="Rollouts per row (GRPO's group) [default: 4]."
    ),
    max_completion_length: int = typer.Option(
        512, "--max-completion", min=16, help="Tokens of a rollout, tool turns included [default: 512]."
    ),
    max_tool_calls: int = typer.Option(
        4, "--max-tool-calls", min=1, help="Tool rounds per rollout [default: 4]."
    ),
    learning_rate: float = typer.Option(1e-5, "--lr", min=0.0, help="Learning rate [default: 1e-05]."),
    temperature: float = typer.Option(
        1.0, "--temperature", min=0.0, help="Sampling temperature [default: 1.0]."
    ),
    beta: float = typer.Option(0.0, "--beta", min=0.0, help="KL coefficient [default: 0.0]."),
    limit: int = typer.Option(None, "--limit", min=1, help="Only the bank's first N rows [default: all]."),
    save_steps: int = typer.Option(10, "--save-steps", min=1, help="Checkpoint every N steps [default: 10]."),
    seed: int = typer.Option(0, "--seed", help="Seed [default: 0]."),
    use_vllm: bool = typer.Option(
        False, "--use-vllm", help="Generate with vLLM, colocated (GPUs) [default: off]."
    ),
    lora_rank: int = typer.Option(
        0,
        "--lora-rank",
        min=0,
        help="LoRA adapters of this rank on every linear layer; 0 trains every weight [default: 0].",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --out from its last checkpoint, optimizer and log."
    ),
    gradient_checkpointing: bool = typer.Option(
        True,
        "--gradient-checkpointing/--no-gradient-checkpointing",
        help="Recompute activations in the backward pass: less memory, more time [default: on].",
    ),
    train_layers: int = typer.Option(
        0, "--train-layers", min=0, help="Train only the top N transformer layers; 0 trains all [default: 0]."
    ),
    reward_weights: str = typer.Option(
        "",
        "--reward-weights",
        help="Weights of the reward's components over every row's own, as name=weight,... (`case-env envs` "
        "lists them) [default: the rows'].",
    ),
) -> None:
    """GRPO with TRL's environment_factory: each rollout's tools call the case-env server within the row's case,
    its reward is case-env's reward for the row (CASE's second stage)."""
    from case_env.trl.train import GRPORun, run_grpo

    _quiet_hub()
    weights = _checked_weights(bank, server_url, limit, reward_weights)
    options = locals()  # every option but these two is the run's field of the same name
    given = {f.name: options[f.name] for f in fields(GRPORun) if f.name not in ("model", "reward_weights")}
    # the model after the cheap checks: preparing a known model takes a while
    run = GRPORun(model=model_dir(model), reward_weights=weights, **given)
    final = run_grpo(run)
    typer.echo(f"wrote {final} ({out / 'curve.png'}, {out / 'log.jsonl'})")
