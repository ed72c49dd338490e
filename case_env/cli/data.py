"""Data, banks and trajectories: `case-env synth`, `data check`, `bank build`, `bank validate`, `traj to-sft`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from case_env.cli.groups import app, bank_app, data_app, fail, traj_app
from case_env.cli.options import options_command
from case_env.core import registry
from case_env.core.parts import Data
from case_env.core.problems import Problems


def _synth(env, options) -> None:
    env.synthesize(options, typer.echo)


options_command(
    app,
    "synth",
    "Generate deterministic synthetic data for an environment.",
    (lambda env: isinstance(env, Data) and env.synth_options is not None, "synthetic generator"),
    lambda env: env.synth_options,
    _synth,
)


@data_app.command("check")
def data_check(
    root: Path = typer.Argument(..., help="Data root to validate."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON document instead of tables."),
) -> None:
    """Validate a data root for every environment with data in it (exit 1 on problems)."""
    summary: dict = {}
    errors: list[str] = []
    warnings: list[str] = []
    lines: list[str] = []
    for env in registry.environments().values():
        found = env.check_data(root) if isinstance(env, Data) else None
        if found is None:
            continue
        summary.update(found.summary)
        lines += found.lines
        errors += found.errors
        warnings += found.warnings
    if not lines and not errors:
        errors.append(
            f"data root {root} holds no data of any environment (run `case-env synth --env ENV --out {root}`)"
        )
    if as_json:
        typer.echo(json.dumps({**summary, "problems": errors, "warnings": warnings}, indent=2))
    else:
        for line in lines:
            typer.echo(line)
        for warning in warnings:
            typer.echo(f"warning: {warning}", err=True)
        for problem in errors:
            typer.echo(f"problem: {problem}", err=True)
        typer.echo(f"check: {'ok' if not errors else f'{len(errors)} problem(s)'}")
    if errors:
        raise typer.Exit(1)


@traj_app.command("to-sft")
def traj_to_sft(
    source: Path = typer.Argument(
        ..., help="A trajectory JSONL file, or a directory of them (e.g. an eval --out)."
    ),
    out: Path = typer.Option(..., "--out", help="Parquet file in verl's multi-turn SFT format."),
    all_: bool = typer.Option(False, "--all", help="Keep incorrect trajectories too."),
) -> None:
    """Write verl multi-turn SFT rows (messages, tools, images) from CASE-format trajectories."""
    from case_env.core.sft_data import TrajectoryFormatError, write_sft

    try:
        n = write_sft(source, out, correct_only=not all_)
    except (FileNotFoundError, TrajectoryFormatError, ValueError) as exc:
        fail(str(exc), 2)
    typer.echo(f"wrote {n} rows to {out}")


def _bank_build(env, options) -> None:
    from case_env.core.bank import weigh_rows, write
    from case_env.core.environment import unknown_weights

    wrong = unknown_weights(env, options.reward_weights)
    if wrong:
        fail(f"--reward-weights: {wrong} (`case-env envs` lists them)", 2)
    built = env.build_bank(options)
    if options.reward_weights:
        weigh_rows(built.result, options.reward_weights)
    manifest = options.out / "bank.json"
    built.problems.echo(lambda line: typer.echo(line, err=True), "problem: ", where=str(manifest))
    meta = {"env": env.name, **built.meta, "reward_weights": options.reward_weights or None}
    write(built.result, options.out, {**meta, "problems": built.problems.to_json()})
    Problems(built.result.skipped).echo(
        lambda line: typer.echo(line, err=True), "skipped ", where=str(manifest)
    )
    for line in built.table:
        typer.echo(line)
    typer.echo(f"wrote {options.out}")


options_command(
    bank_app,
    "build",
    "Build a bank of an environment's questions or cases: train/val/test parquet, case lists and bank.json.",
    (lambda env: isinstance(env, Data), "bank builder"),
    lambda env: env.bank_options,
    _bank_build,
)


@bank_app.command("validate")
def bank_validate(
    files: list[Path] = typer.Argument(..., help="Parquet files in the CASE schema, or bank directories."),
) -> None:
    """Check parquet banks: columns, extra_info, ground truth, complete tool keys, each row by its environment."""
    from case_env.core.bank import bank_files
    from case_env.core.validate import validate

    try:
        paths = [split for given in files for split in (bank_files(given) if given.is_dir() else [given])]
    except FileNotFoundError as exc:
        fail(str(exc), 2)
    failed = False
    for path in paths:
        result = validate(path)
        sources = ", ".join(f"{k} {v}" for k, v in sorted(result.by_source.items()))
        cases = len(result.by_case)
        typer.echo(f"{path}: {result.rows} rows, {cases} case{'' if cases == 1 else 's'} ({sources})")
        for problem in result.problems:
            typer.echo(f"problem: {path.name}: {problem}", err=True)
        failed |= not result.ok
    if failed:
        raise typer.Exit(1)
