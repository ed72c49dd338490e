"""The command groups of `case-env` (`case-env data ...`, `case-env bench ...`), and how a command refuses."""

from __future__ import annotations

from typing import NoReturn

import typer

from case_env.core.commands import plain_app
from case_env.core.errors import CommandError
from case_env.trl.commands import model_app, trl_app

app = plain_app(
    help="case-env: RL environment server for clinical agents that gather evidence with tools.",
    no_args_is_help=True,
)
data_app = typer.Typer(help="Inspect and validate a data root.", no_args_is_help=True)
bank_app = typer.Typer(help="Build and validate banks in the CASE parquet schema.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Benchmarks (figures are ratios and timings measured in one run).", no_args_is_help=True
)
traj_app = typer.Typer(help="Work with recorded trajectories.", no_args_is_help=True)
train_app = typer.Typer(
    help="Training on GPUs with verl: check a run before it starts, then start it.", no_args_is_help=True
)
app.add_typer(data_app, name="data")
app.add_typer(bank_app, name="bank")
app.add_typer(bench_app, name="bench")
app.add_typer(traj_app, name="traj")
app.add_typer(train_app, name="train")
train_app.add_typer(trl_app, name="trl")
app.add_typer(model_app, name="model")
GROUPS = {
    "root": app,
    "data": data_app,
    "bank": bank_app,
    "bench": bench_app,
    "traj": traj_app,
    "train": train_app,
}
# `case-env train` passes its arguments to the launcher's own parser (scripts/train_grpo.sh takes the same),
# whose --help lists them; unknown ones are Hydra overrides for verl
LAUNCHER_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def fail(message: str, code: int = 1) -> NoReturn:
    """A refusal: `main` prints `error: message` and exits with `code` (2: a wrong argument)."""
    raise CommandError(message, code)
