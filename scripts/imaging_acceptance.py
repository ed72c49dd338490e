#!/usr/bin/env python3
"""The imaging environment's figures on real-data-shaped roots: a bank from measured truth on
synthetic patients whose phantom manifests were removed, with the synthetic clinical table; its agreement
with the manifest truth on the same patients; and the scripted agents and prompt-only baselines on it.

    .venv/bin/python scripts/imaging_acceptance.py --patients 30 --out bench-out/imaging

Generates the patients (or reuses --root), copies them without manifests, builds both banks, starts
`case-env serve` on loopback over the manifest-free copy, runs the scripted text agent, the vision agent,
no-tool and random (random with --repeats) over every split, and writes acceptance.json.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Annotated

import typer

from case_env.bench.process import ServerProcess
from case_env.core.bank import write
from case_env.core.commands import run
from case_env.envs.imaging.bank.build import build
from case_env.envs.imaging.clinical import load_clinical
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.synth.writer import generate_dataset
from case_env.eval.runner import run_eval

AGENTS = {"scripted": 1, "vision": 1, "no-tool": None, "random": None}  # None: --repeats


def answers(result) -> dict[tuple, str]:
    out = {}
    for rows in result.rows.values():
        for row in rows:
            extra = json.loads(row["extra_info"])
            out[(extra["patient_id"], extra["template"], extra["question"])] = extra["options"][
                row["reward_model"]["ground_truth"]
            ]
    return out


def main(
    patients: Annotated[int, typer.Option(help="Synthetic patients.")] = 30,
    seed: Annotated[int, typer.Option(help="Seed of the patients and the bank.")] = 0,
    repeats: Annotated[int, typer.Option(help="Rollouts per row of the prompt-only baselines.")] = 20,
    root: Annotated[
        Path | None, typer.Option(help="An existing synthetic root [default: generated in --out].")
    ] = None,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("bench-out/imaging"),
) -> None:
    """Run the imaging acceptance comparison."""
    started = time.perf_counter()
    if root is None:
        root = out / "root"
        generate_dataset(root, patients, "ci", seed, jobs=os.cpu_count() or 1)
    real = out / "no-manifests"
    shutil.rmtree(real, ignore_errors=True)
    shutil.copytree(root, real, ignore=shutil.ignore_patterns("*_phantom.json"))
    store = PatientStore(real)
    clinical = load_clinical(store)
    measured = build(store, seed, (0.8, 0.1, 0.1), "measured", clinical.diagnoses if clinical else None)
    manifest = build(PatientStore(root), seed, (0.8, 0.1, 0.1), "manifest")
    bank = out / "bank"
    write(measured, bank, {"env": "imaging", "truth": "measured", "data_root": str(real)})
    a, b = answers(measured), answers(manifest)
    common = sorted(set(a) & set(b))
    agree = sum(a[k] == b[k] for k in common)
    figures: dict = {
        "patients": len(store.patient_ids()),
        "questions": len(a),
        "agreement": {"common": len(common), "agree": agree, "rate": round(agree / len(common), 4)},
        "disagreements": [[*k, a[k], b[k]] for k in common if a[k] != b[k]],
        "skipped_by_template": measured.skipped_by_template,
        "runs": {},
    }
    print(f"measured vs manifest truth: {agree}/{len(common)} questions agree ({agree / len(common):.4f})")
    with ServerProcess(
        out / "server.log", {"CASE_ENV_DATA_ROOT": str(real), "CASE_ENV_TOKEN": None}
    ) as server:
        for agent, rollouts in AGENTS.items():
            run_dir = out / "runs" / agent
            shutil.rmtree(run_dir, ignore_errors=True)
            results = run_eval(bank, server.url, agent, run_dir, repeats=rollouts or repeats, progress=False)
            figures["runs"][agent] = {
                "overall": results["overall"],
                "by_data_source": results["by_data_source"],
            }
            cells = ", ".join(
                f"{s} {v['accuracy']:.3f} (n={v['n']}, chance {v['chance']:.3f})"
                for s, v in sorted(results["by_data_source"].items())
            )
            print(f"{agent:9s} {cells}")
    figures["seconds"] = round(time.perf_counter() - started, 1)
    (out / "acceptance.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out / 'acceptance.json'}")


if __name__ == "__main__":
    run(main)
