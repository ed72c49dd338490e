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

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from case_env.bench.process import ServerProcess
from case_env.core.bank import write
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patients", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=20, help="Rollouts per row of the prompt-only baselines."
    )
    parser.add_argument("--root", type=Path, help="An existing synthetic root (default: generated in --out).")
    parser.add_argument("--out", type=Path, default=Path("bench-out/imaging"))
    args = parser.parse_args()
    started = time.perf_counter()
    root = args.root or args.out / "root"
    if args.root is None:
        generate_dataset(root, args.patients, "ci", args.seed, jobs=os.cpu_count() or 1)
    real = args.out / "no-manifests"
    shutil.rmtree(real, ignore_errors=True)
    shutil.copytree(root, real, ignore=shutil.ignore_patterns("*_phantom.json"))
    store = PatientStore(real)
    clinical = load_clinical(store)
    measured = build(store, args.seed, (0.8, 0.1, 0.1), "measured", clinical.diagnoses if clinical else None)
    manifest = build(PatientStore(root), args.seed, (0.8, 0.1, 0.1), "manifest")
    bank = args.out / "bank"
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
        args.out / "server.log", {"CASE_ENV_DATA_ROOT": str(real), "CASE_ENV_TOKEN": None}
    ) as server:
        for agent, repeats in AGENTS.items():
            out = args.out / "runs" / agent
            shutil.rmtree(out, ignore_errors=True)
            results = run_eval(bank, server.url, agent, out, repeats=repeats or args.repeats, progress=False)
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
    (args.out / "acceptance.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out / 'acceptance.json'}")


if __name__ == "__main__":
    main()
