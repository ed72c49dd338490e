"""`case-env bench model` and `case-env bench server`: figures measured in one run."""

from __future__ import annotations

from pathlib import Path

import typer

from case_env.cli.groups import bench_app, fail
from case_env.cli.options import options_command
from case_env.core import registry
from case_env.core.parts import Benchmarks, ServerBenchOptions


@bench_app.command("model")
def bench_model(
    model: str = typer.Option(
        "smollm2", "--model", help="A Hugging Face model directory, or smollm2 [default: smollm2]."
    ),
    out: Path = typer.Option(
        Path("bench-out/model"), "--out", help="Where model.json goes [default: bench-out/model]."
    ),
    prompt_tokens: int = typer.Option(512, "--prompt-tokens", min=1, help="Prompt length [default: 512]."),
    new_tokens: int = typer.Option(
        64, "--new-tokens", min=1, help="Tokens decoded per sequence [default: 64]."
    ),
) -> None:
    """Tokens per second of a model on this machine: case-env's engine against transformers' generate, in one
    run (needs the model extra)."""
    from case_env.trl.commands import model_dir

    path = Path(model_dir(model))
    from case_env.bench.lm import bench_model as run
    from case_env.bench.lm import summary_lines

    for line in summary_lines(run(path, out, prompt_tokens=prompt_tokens, new_tokens=new_tokens)):
        typer.echo(line)
    typer.echo(f"wrote {out / 'model.json'}")


def _bench_server(env: Benchmarks, options: ServerBenchOptions) -> None:
    """Throughput, per-tool latency and errors of `case-env serve` under concurrent rollouts of one
    environment, against peers, floors and bounds measured in the same run."""
    from case_env.bench.model_server import bench_server as run_bench

    given = options.model_fields_set
    if "out" not in given and env.name != registry.default().name:
        options = options.model_copy(update={"out": Path(f"bench-out/server-{env.name}")})
    if "rollouts" not in given and env.server_bench is not None:
        options = options.model_copy(update={"rollouts": MODEL_BENCH_ROLLOUTS})
    try:
        run_bench(env, options, typer.echo)
    except ValueError as exc:
        fail(str(exc), 2)


options_command(
    bench_app,
    "server",
    "Throughput, per-tool latency and errors of `case-env serve` under concurrent rollouts of one environment, "
    "against peers, floors and bounds measured in the same run.",
    (lambda env: isinstance(env, Benchmarks), "server benchmark"),
    lambda env: ServerBenchOptions,
    _bench_server,
)

# a training step's episodes: 64 prompts x 16 samples (MedExAgent's GRPO step)
MODEL_BENCH_ROLLOUTS = 1024
