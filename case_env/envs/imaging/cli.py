"""The imaging environment's own commands: `ingest ukb`, `segment`, `bench data`, `bench render`, `bench ingest` (and its
`bench server`, `case_env.envs.imaging.bench.server.bench_server`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


def register(groups: dict[str, typer.Typer]) -> None:
    _register_bench(groups["bench"])
    _register_real_data(groups["root"])


def _register_real_data(root: typer.Typer) -> None:
    ingest = typer.Typer(help="Convert downloads into a data root.", no_args_is_help=True)
    root.add_typer(ingest, name="ingest")

    @ingest.command("ukb")
    def ingest_ukb(
        zips: Path = typer.Option(
            ..., "--zips", help="Directory of <eid>_20201_<instance>_0.zip files (read only)."
        ),
        out: Path = typer.Option(..., "--out", help="Data root to write (finished visits are skipped)."),
        jobs: int = typer.Option(0, "--jobs", min=0, help="Visits in parallel (0: one per CPU)."),
        slice_mm: float | None = typer.Option(
            None,
            "--slice-mm",
            min=0.1,
            help="Slice spacing of the stitched volume (default: the finest station's).",
        ),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    ) -> None:
        """UK Biobank field-20201 DICOM zips (6 stations x 4 Dixon channels per visit) into stitched NIfTI."""
        from tqdm import tqdm

        from case_env.envs.imaging.ukb.dicom import ZipError
        from case_env.envs.imaging.ukb.ingest import ingest as run

        # a bar on a terminal; in a log, only the problems and the summary line
        bar = tqdm(total=0, unit="visit", disable=not (progress and sys.stderr.isatty()), desc="ingest")

        def step(result, done: int, total: int) -> None:
            bar.total = total
            bar.update(1)
            if result.status == "failed":
                bar.write(f"problem: {result.problem}", file=sys.stderr)

        try:
            summary = run(zips, out, jobs, slice_mm, step)
        except ZipError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        finally:
            bar.close()
        for problem in summary.problems:
            if not any(r.problem == problem for r in summary.results):
                typer.echo(f"problem: {problem}", err=True)
        written = [r.seconds for r in summary.results if r.status == "written"]
        mean = f", {sum(written) / len(written):.1f} s per visit" if written else ""
        typer.echo(
            f"{out}: {summary.count('written')} visits written{mean}, {summary.count('skipped')} already "
            f"finished, {summary.count('failed')} failed"
        )
        if summary.problems:
            raise typer.Exit(1)

    @root.command("segment")
    def segment(
        root_dir: Path = typer.Argument(..., help="Data root whose visits need organ label maps."),
        copy_from: Path | None = typer.Option(
            None,
            "--copy-derivatives-from",
            help="Take label maps, lesion maps and reports from another root (matched by eid and session; "
            "grids must agree) instead of running a segmentation engine [default: none].",
        ),
        device: str = typer.Option("cpu", "--device", help="TotalSegmentator device: cpu, gpu or mps."),
        force: bool = typer.Option(False, "--force", help="Replace existing label maps."),
    ) -> None:
        """Organ label maps (VISTA3D ids) for visits without one: TotalSegmentator's total_mr task, then
        volumetry."""
        from case_env.envs.imaging.ukb.segment import SegmentError, copy_derivatives, segment_root

        try:
            if copy_from is not None:
                lines = copy_derivatives(copy_from, root_dir, force)
            else:
                lines = segment_root(root_dir, device=device, force=force)
        except SegmentError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        for line in lines:
            typer.echo(line)


def _register_bench(bench: typer.Typer) -> None:
    @bench.command("render")
    def bench_render(
        data_root: Path = typer.Option(
            Path("data/bench"), "--data-root", help="Data root (`bench server`'s)."
        ),
        calls: int = typer.Option(400, "--calls", min=1, help="Renders per pass."),
        repeats: int = typer.Option(7, "--repeats", min=1, help="Passes; the least is reported."),
        seed: int = typer.Option(0, "--seed", help="Seed of the render mix."),
        out: Path | None = typer.Option(
            None, "--out", help="Also write the figures here as JSON [default: none]."
        ),
    ) -> None:
        """CPU per uncached render_slice in one thread, against the deflate floor and the thread hop."""
        from case_env.envs.imaging.bench.render import run_render_bench

        figures = run_render_bench(data_root, calls, repeats, seed)
        for key, value in figures.items():
            typer.echo(f"{key:20s} {value}")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")

    @bench.command("ingest")
    def bench_ingest(
        out: Path = typer.Option(
            Path("bench-out/ingest"), "--out", help="Directory for bench.json and scratch data."
        ),
        patients: int = typer.Option(2, "--patients", min=1, help="Patients (two visits each) per profile."),
        profiles: str = typer.Option("ci,full", "--profiles", help="Comma-separated profiles to measure."),
    ) -> None:
        """Time per visit and peak memory of `ingest ukb`, beside the pydicom read floor of the same zips."""
        from case_env.envs.imaging.bench.ingest import run_ingest_bench

        result = run_ingest_bench(out, patients, [p.strip() for p in profiles.split(",") if p.strip()])
        typer.echo(json.dumps(result, indent=2))

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
