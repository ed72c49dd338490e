"""Running policies and training: `case-env verl-config`, `rollouts`, `eval`, `train preflight` and `train run`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from case_env.cli.groups import LAUNCHER_ARGS, app, fail, train_app
from case_env.core import registry
from case_env.core.parts import evaluation_of

if TYPE_CHECKING:
    from case_env.eval.openai_agent import ModelSettings


@app.command("verl-config")
def verl_config(
    out: Path = typer.Option(Path("configs/verl"), "--out", help="Directory for the tool YAML files."),
    env: list[str] | None = typer.Option(None, "--env", help="Only these environments (default: all)."),
) -> None:
    """Write verl's tool config of each environment (<out>/<env>.yaml: one CaseTool entry per tool)."""
    from case_env.verl.config import write_all

    try:
        for path in write_all(out, env or None):
            typer.echo(f"wrote {path}")
    except registry.RegistryError as exc:
        fail(str(exc), 2)


@app.command()
def rollouts(
    bank: Path = typer.Option(Path("data/bank"), "--bank", help="Bank directory."),
    split: str = typer.Option("test", "--split", help="Which split's rows to roll out."),
    server_url: str = typer.Option(
        "http://127.0.0.1:8765", "--server-url", help="case-env server (started if absent)."
    ),
    data_root: Path = typer.Option(
        Path("data/synthetic"), "--data-root", help="Data root for a started server."
    ),
    per_source: int = typer.Option(8, "--per-source", min=1, help="Rows per data source."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Trajectories in flight."),
    form: str = typer.Option(
        "hermes", "--format", help="Tool-call format of the model and verl's parser: hermes or qwen3_coder."
    ),
    model: str = typer.Option(
        None,
        "--model",
        help="A language model generating on this machine (a Hugging Face directory, or smollm2) instead of "
        "the scripted baseline (needs the model extra) [default: none, the scripted baseline].",
    ),
    temperature: float = typer.Option(
        0.0, "--temperature", min=0.0, help="The model's sampling temperature."
    ),
    seed: int = typer.Option(0, "--seed", help="The model's sampling seed."),
    response_length: int = typer.Option(
        2048, "--response-length", min=16, help="verl's response budget of a trajectory, in tokens."
    ),
    max_turns: int = typer.Option(8, "--max-turns", min=1, help="The model's assistant turns per row."),
    out: Path = typer.Option(
        None,
        "--out",
        help="Write rollouts.json and every turn (turns.jsonl) here [default: none, not written].",
    ),
) -> None:
    """Roll a bank's rows out through verl's agent loops, scored by verl's reward manager: the environment's
    scripted baseline, or a model generating on this machine (--model). Needs verl."""
    from case_env.core.bank import BankError, read_bank, split_file
    from case_env.core.calls import FORMATS
    from case_env.server.control import ensure_server, stop

    if form not in FORMATS:
        fail(f"unknown tool-call format {form!r}; choose {' or '.join(FORMATS)}", 2)
    try:
        parquet = split_file(bank, split)
        read_bank(parquet, columns=["data_source"])  # a broken file refused now, as eval refuses it
    except (FileNotFoundError, BankError) as exc:
        fail(str(exc), 2)
    if model is not None:
        from case_env.trl.commands import model_dir

        model = model_dir(model)
    server = ensure_server(server_url, data_root)
    try:
        if model is None:
            from case_env.verl.rollouts import run_rollouts

            summary = run_rollouts(parquet, server_url, per_source, concurrency, form)
        else:
            from case_env.verl.model_rollouts import ModelRun, run_model_rollouts

            run = ModelRun(
                model,
                temperature,
                seed=seed,
                response_length=response_length,
                max_turns=max_turns,
                form=form,
            )
            summary = run_model_rollouts(parquet, server_url, per_source, concurrency, run, out)
    finally:
        stop(server)
    _rollouts_table(summary, model is not None)


def _rollouts_table(summary: dict, model: bool) -> None:
    header = f"{'data source':18s} {'n':>4s} {'reward':>7s} {'accuracy':>9s} {'format ok':>10s} {'calls':>6s} {'ok':>5s} {'infra':>6s}"
    if model:
        header += f" {'turns':>6s} {'call turns':>11s} {'misparsed':>10s} {'tokens/turn':>12s} {'crashes':>8s}  floors"
    typer.echo(header)
    for source, s in summary.items():
        if not s.n:
            continue
        line = (
            f"{source:18s} {s.n:4d} {s.reward / s.n:7.2f} {s.correct / s.n:9.2f} {s.format_ok / s.n:10.2f} "
            f"{s.tool_calls / s.n:6.1f} {s.calls_ok / s.n:5.1f} {s.infra_errors:6d}"
        )
        if model:
            per_turn = s.tokens / s.turns if s.turns else 0.0
            floors = ", ".join(f"{k} {v:.2f}" for k, v in s.floors.items()) or "-"
            line += f" {s.turns / s.n:6.1f} {s.call_turns / max(s.turns, 1):11.2f} {s.misparsed:10d} {per_turn:12.1f} {s.crashes:8d}  {floors}"
        typer.echo(line)


@train_app.command("preflight", context_settings=LAUNCHER_ARGS, add_help_option=False)
def train_preflight(ctx: typer.Context) -> None:
    """Check a training run before it starts (exit 2 when a check fails; --help lists the options)."""
    from case_env.verl import grpo

    raise typer.Exit(grpo.main(ctx.args, preflight_only=True))


@train_app.command("run", context_settings=LAUNCHER_ARGS, add_help_option=False)
def train_run(ctx: typer.Context) -> None:
    """Start a GRPO run on verl after the preflight, as scripts/train_grpo.sh does (--help: options)."""
    from case_env.verl import grpo

    raise typer.Exit(grpo.main(ctx.args))


# the openai agent's options of `case-env eval`
ModelUrl = Annotated[
    str | None,
    typer.Option(
        "--model-url",
        help="openai agent: base URL of an OpenAI-compatible server, e.g. http://host:8000/v1 [default: none].",
    ),
]
ModelName = Annotated[
    str | None, typer.Option("--model", help="openai agent: model name to request [default: none].")
]
ApiKey = Annotated[str, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="openai agent: API key.")]
CallTimeout = Annotated[
    float, typer.Option("--call-timeout", min=1.0, help="openai agent: seconds per completion.")
]
Temperature = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        min=0.0,
        help="openai agent: sampling temperature (default: the environment's for independent samples, "
        "0.6 for case reasoning; 0 for everything else).",
    ),
]
MaxTokens = Annotated[
    int, typer.Option("--max-tokens", min=1, help="openai agent: tokens of one completion.")
]


@app.command("eval")
def eval_(
    bank: Path = typer.Option(
        ..., "--bank", help="A bank parquet file, or a bank directory (all its splits)."
    ),
    server_url: str = typer.Option(..., "--server", help="Base URL of a running case-env server."),
    agent: str = typer.Option(
        ..., "--agent", help="openai, or one of the bank environment's scripted agents."
    ),
    out: Path = typer.Option(
        ..., "--out", help="Directory for trajectories.jsonl, images/, results.json, report.html."
    ),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="Rollouts in flight."),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Only the first N rows [default: every row]."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue a run in --out, skipping finished rollouts."
    ),
    token: str | None = typer.Option(
        None, "--token", envvar="CASE_ENV_TOKEN", help="Bearer token of the server [default: none]."
    ),
    repeats: int = typer.Option(
        1, "--repeats", min=1, help="Rollouts per row; figures are means over all of them."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the stochastic scripted agents' draws."),
    model_url: ModelUrl = None,
    model_name: ModelName = None,
    api_key: ApiKey = "EMPTY",
    max_turns: int | None = typer.Option(
        None, "--max-turns", min=1, help="Assistant turns per rollout (default: the environment's)."
    ),
    call_timeout: CallTimeout = 120.0,
    temperature: Temperature = None,
    max_tokens: MaxTokens = 2048,
    greedy_samples: bool = typer.Option(
        False,
        "--greedy-samples",
        help="Allow --temperature 0 with several independent samples per row (they are then identical).",
    ),
    protocol: str | None = typer.Option(
        None,
        "--protocol",
        help="The bank environment's evaluation protocol, as `case-env envs` lists them (default: its first).",
    ),
) -> None:
    """Evaluate a policy over a bank against a live server; prints the environment's summary."""
    from case_env.eval.openai_agent import ModelSettings
    from case_env.eval.runner import OPENAI, run_eval

    known = {a for env in registry.environments().values() for a in evaluation_of(env).baselines} | {OPENAI}
    if agent not in known:
        fail(f"unknown agent {agent!r}; choose one of {', '.join(sorted(known))}", 2)
    model = None
    if agent == OPENAI:
        if not model_url or not model_name:
            fail("the openai agent needs --model-url and --model", 2)
        model = ModelSettings(
            model_url, model_name, api_key, max_turns, call_timeout, temperature, max_tokens=max_tokens
        )
    with _eval_failures(server_url, model, out):
        results = run_eval(
            *(bank, server_url, agent, out, concurrency, limit, resume, token),
            model=model,
            repeats=repeats,
            seed=seed,
            max_turns=max_turns,
            greedy_samples=greedy_samples,
            protocol=protocol,
        )
    for line in evaluation_of(registry.get(results["env"])).summary_lines(results):
        typer.echo(line)
    if results.get("components"):
        means = ", ".join(f"{name} {value:.3f}" for name, value in results["components"].items())
        typer.echo(f"reward components (means): {means}")
    typer.echo(f"wrote {out / 'results.json'}, {out / 'report.html'} and {out / 'trajectories.jsonl'}")


@contextlib.contextmanager
def _eval_failures(server_url: str, model: ModelSettings | None, out: Path) -> Iterator[None]:
    """An eval's failures as one line each: its input (exit 2), the case-env server or the model's (1)."""
    import httpx
    from openai import APIError, APITimeoutError

    from case_env.core.trajectory import TrajectoryFormatError

    try:
        yield
    except (FileNotFoundError, FileExistsError, LookupError, TrajectoryFormatError, ValueError) as exc:
        fail(str(exc), 2)
    except httpx.HTTPError as exc:
        fail(f"server {server_url} failed: {exc}", 1)
    except APIError as exc:  # the model's server, not a row: what finished is kept for --resume
        assert model is not None
        slow = isinstance(exc, APITimeoutError)
        fail(
            f"the model server {model.base_url} failed: {exc} (a completion may take --call-timeout "
            f"{model.timeout_s:g} s, tried 3 times); the finished rows are kept in {out}: run again with "
            "--resume" + (" and a larger --call-timeout" if slow else ""),
            1,
        )
