"""The imaging environment's own commands: `case-env bench data` and `case-env bench server`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer


def register(groups: dict[str, typer.Typer]) -> None:
    bench = groups["bench"]

    @bench.command("data")
    def bench_data(
        out: Path = typer.Option(
            Path("bench-out/data"), "--out", help="Directory for bench.json and scratch data."
        ),
        patients: int = typer.Option(2, "--patients", min=1, help="Patients generated per profile."),
        profiles: str = typer.Option("ci,full", "--profiles", help="Comma-separated profiles to measure."),
        cache_mb: int = typer.Option(
            512, "--cache-mb", min=1, help="Cache budget for the memory measurement."
        ),
    ) -> None:
        """Generation, first-touch load, slice fetch and memory figures of the imaging data layer."""
        from case_env.envs.imaging.bench.data import run_data_bench

        result = run_data_bench(
            out, patients, [p.strip() for p in profiles.split(",") if p.strip()], cache_mb
        )
        typer.echo(json.dumps(result, indent=2))

    @bench.command("server")
    def bench_server(
        data_root: Path = typer.Option(
            Path("data/synthetic"),
            "--data-root",
            help="Data root (10 ci-profile patients generated if missing).",
        ),
        out: Path = typer.Option(
            Path("bench-out/server"), "--out", help="Directory for bench.json and bench.png."
        ),
        rollouts: int = typer.Option(
            256, "--rollouts", "--clients", min=1, help="Concurrent virtual rollouts."
        ),
        duration: float = typer.Option(
            20.0, "--duration", min=1, help="Measured seconds per engine (after warm-up)."
        ),
        warmup: float = typer.Option(5.0, "--warmup", min=0, help="Unmeasured seconds first (caches fill)."),
        workers: int = typer.Option(2, "--workers", min=1, help="Server worker processes (both engines)."),
        baseline: str | None = typer.Option(
            None, "--baseline", help="'naive': also run the naive reference engine and report ratios."
        ),
        cache_mb: int | None = typer.Option(
            None, "--cache-mb", min=0, help="Decoded-volume cache budget per worker."
        ),
        think_ms: float = typer.Option(
            0.0, "--think-ms", min=0, help="Mean model time before each call (exponential); 0 = closed loop."
        ),
        group_size: int = typer.Option(
            1,
            "--group-size",
            min=1,
            help="Rollouts per GRPO group sharing patient and calls (1: all independent).",
        ),
    ) -> None:
        """Throughput, per-tool latency, errors, server CPU and peak RSS of `case-env serve` under concurrent
        imaging rollouts."""
        from case_env.envs.imaging.bench.server import run_server_bench
        from case_env.envs.imaging.synth.writer import generate_dataset

        if baseline not in (None, "naive"):
            typer.echo(f"error: unknown baseline {baseline!r}; the only one is 'naive'", err=True)
            raise typer.Exit(2)
        if not data_root.is_dir():
            typer.echo(f"{data_root} missing: generating 10 ci-profile patients")
            generate_dataset(data_root, 10, "ci", 0, jobs=os.cpu_count() or 1)
        result = run_server_bench(
            data_root, out, rollouts, duration, workers, warmup, baseline, cache_mb, think_ms, group_size
        )
        for engine, run in result["runs"].items():
            typer.echo(
                f"\n{engine}: {run['calls_per_s']} calls/s, {rollouts} rollouts, {workers} worker(s), "
                f"server CPU {run['server_cpu_cores']} cores, peak RSS {run['server_peak_rss_mb']} MB, "
                f"errors {run['errors'] or 'none'}"
            )
            typer.echo(f"  {'tool':22s} {'n':>7s} {'p50 ms':>8s} {'p95 ms':>8s} {'p99 ms':>8s}")
            for tool, f in {**run["latency_ms"], "all": run["latency_ms_all"]}.items():
                typer.echo(f"  {tool:22s} {f['n']:7d} {f['p50']:8.1f} {f['p95']:8.1f} {f['p99']:8.1f}")
        if "ratio_vs_naive" in result:
            r = result["ratio_vs_naive"]
            typer.echo(f"\nvs naive: {r['throughput']}x throughput, {r['p99']}x lower p99")
        met = result["met"]
        typer.echo("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items()))
        typer.echo(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")
