"""Held-out figures of several `case-env rollouts --model ... --out DIR` runs on the same rows, and the paired
bootstrap 95% interval of each run's difference from a reference run (RL minus SFT, say).

    python scripts/compare_runs.py --ref sft=runs/sft-test rl-0=runs/rl0-test rl-1=runs/rl1-test base=runs/base

Rows are paired by (data source, case, question): a run's rows are its `turns.jsonl`. For accuracy, reward
and format, the table gives each run's mean and, for every run but the reference, the mean difference with its
interval from 10,000 resamples of the paired rows (percentile method); `--json` writes the figures.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated

import typer

FIGURES = {"accuracy": "acc", "reward": "score", "format": "format_ok"}


def rows(run: Path) -> dict[tuple, dict]:
    found = {}
    for line in (run / "turns.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        reward = record.get("reward") or {}
        key = (record["data_source"], record.get("case"), record.get("question"))
        found[key] = {name: float(reward.get(field, 0.0) or 0.0) for name, field in FIGURES.items()}
        found[key]["calls"] = float(len(record.get("calls") or []))
    return found


def paired_interval(diffs: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean difference and its 95% percentile-bootstrap interval."""
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return sum(diffs) / n, means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def main(
    runs: Annotated[list[str], typer.Argument(help="NAME=DIR of each run (its turns.jsonl).")],
    ref: Annotated[str, typer.Option(help="NAME=DIR of the reference run the others are compared with.")],
    out: Annotated[Path | None, typer.Option("--json", help="Write the figures here too.")] = None,
) -> None:
    named = dict(item.split("=", 1) for item in [ref, *runs])
    reference = ref.split("=", 1)[0]
    found = {name: rows(Path(path)) for name, path in named.items()}
    shared = sorted(set.intersection(*(set(r) for r in found.values())), key=str)
    if not shared:
        raise SystemExit("the runs share no row")
    report: dict = {"rows": len(shared), "runs": {}}
    typer.echo(f"{len(shared)} rows in every run")
    typer.echo(f"{'run':14s} {'accuracy':>9s} {'reward':>9s} {'format':>9s} {'calls':>7s}")
    for name, got in found.items():
        means = {f: sum(got[k][f] for k in shared) / len(shared) for f in [*FIGURES, "calls"]}
        report["runs"][name] = {"means": means}
        line = f"{name:14s} " + " ".join(f"{means[f]:9.3f}" for f in FIGURES) + f" {means['calls']:7.2f}"
        typer.echo(line)
    for name, got in found.items():
        if name == reference:
            continue
        report["runs"][name]["minus_" + reference] = {}
        parts = []
        for figure in FIGURES:
            diffs = [got[k][figure] - found[reference][k][figure] for k in shared]
            mean, low, high = paired_interval(diffs)
            report["runs"][name]["minus_" + reference][figure] = {"mean": mean, "low": low, "high": high}
            parts.append(f"{figure} {mean:+.3f} [{low:+.3f}, {high:+.3f}]")
        typer.echo(f"{name} - {reference}: " + "; ".join(parts))
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    typer.run(main)
