"""The `case-env` command line.

Expected failures (bad data, a directory we must not overwrite) print one clear line per problem and exit
non-zero; anything unexpected prints a one-line internal error instead of a traceback, unless
CASE_ENV_DEBUG=1 asks for the traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import typer

from case_env import __version__

app = typer.Typer(
    help="case-env: RL environment server for clinical agents that gather evidence with tools.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="Inspect and validate a patient data root.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Benchmarks (figures are ratios and timings measured in one run).", no_args_is_help=True
)
app.add_typer(data_app, name="data")
app.add_typer(bench_app, name="bench")

KEY_ORGANS = ("liver", "spleen", "pancreas", "left_kidney", "right_kidney", "gallbladder", "stomach", "heart")


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def version() -> None:
    """Print the package version."""
    typer.echo(__version__)


@app.command()
def synth(
    out: Path = typer.Option(..., "--out", help="Output data root (created; must be empty or ours)."),
    patients: int = typer.Option(10, "--patients", min=1, max=9999, help="Number of patients."),
    profile: str = typer.Option(
        "ci", "--profile", help="ci (112x87x185, fast) or full (224x174x370, UK Biobank grid)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of all ground truth and noise."),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing synthetic dataset with other settings."
    ),
    jobs: int = typer.Option(0, "--jobs", help="Worker processes (0: one per CPU)."),
) -> None:
    """Generate deterministic synthetic longitudinal Dixon MRI patients."""
    from case_env.synth.geometry import PROFILES
    from case_env.synth.writer import DatasetExistsError, generate_dataset

    if profile not in PROFILES:
        _fail(f"unknown profile {profile!r}; choose one of: {', '.join(PROFILES)}", 2)
    workers = jobs or os.cpu_count() or 1
    start = time.perf_counter()

    def progress(s) -> None:
        per_visit = ", ".join(f"{t:.1f}" for t in s.seconds_per_visit)
        typer.echo(f"  {s.public_id} ({s.subject}) {s.sex} {s.age}y {s.scenario:26s} {per_visit} s/visit")

    try:
        summaries, written = generate_dataset(out, patients, profile, seed, force, workers, progress)
    except DatasetExistsError as exc:
        _fail(str(exc))
        return
    if not written:
        typer.echo(
            f"{out}: {patients} {profile}-profile patients with seed {seed} already present; nothing to do"
        )
        return
    typer.echo(f"wrote {len(summaries)} patients to {out} in {time.perf_counter() - start:.1f} s")


@data_app.command("check")
def data_check(
    root: Path = typer.Argument(..., help="Data root to validate."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON document instead of tables."),
) -> None:
    """Validate a data root and print each patient's organ volumes per visit (exit 1 on problems)."""
    from case_env.data.check import check_root

    report = check_root(root)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_check(report)
    if report.errors:
        raise typer.Exit(1)


def _print_check(report) -> None:
    header = f"{'patient':10s} {'visit':10s} {'date':10s} " + " ".join(f"{o[:12]:>12s}" for o in KEY_ORGANS)
    typer.echo(f"data root {report.root}: {len(report.patients)} patients (volumes in mL)")
    typer.echo(header + "  organs")
    for patient in report.patients:
        for v in patient.visits:
            cells = " ".join(f"{v.organs[o]:12.1f}" if o in v.organs else f"{'-':>12s}" for o in KEY_ORGANS)
            typer.echo(
                f"{patient.patient_id:10s} {v.visit:10s} {v.acq_date or '-':10s} {cells}  {len(v.organs)}"
            )
    for warning in report.warnings:
        typer.echo(f"warning: {warning}", err=True)
    for problem in report.errors:
        typer.echo(f"problem: {problem}", err=True)
    status = "ok" if not report.errors else f"{len(report.errors)} problem(s)"
    typer.echo(f"check: {status}")


@bench_app.command("data")
def bench_data(
    out: Path = typer.Option(
        Path("bench-out/data"), "--out", help="Directory for bench.json and scratch data."
    ),
    patients: int = typer.Option(2, "--patients", min=1, help="Patients generated per profile."),
    profiles: str = typer.Option("ci,full", "--profiles", help="Comma-separated profiles to measure."),
    cache_mb: int = typer.Option(512, "--cache-mb", min=1, help="Cache budget for the memory measurement."),
) -> None:
    """Generation, first-touch load, slice fetch and memory figures of the data layer."""
    from case_env.bench.data import run_data_bench

    result = run_data_bench(out, patients, [p.strip() for p in profiles.split(",") if p.strip()], cache_mb)
    typer.echo(json.dumps(result, indent=2))


def main() -> None:
    from case_env.memory import release_freed_memory_promptly

    release_freed_memory_promptly()
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("CASE_ENV_DEBUG") == "1":
            raise
        typer.echo(
            f"internal error: {type(exc).__name__}: {exc} (set CASE_ENV_DEBUG=1 for a traceback)", err=True
        )
        sys.exit(70)


if __name__ == "__main__":
    main()
