#!/usr/bin/env python3
"""The clinic environment's acceptance figures: the scripted clinician against the no-exam clinician, on
the same synthetic cases without noise, at MedExAgent's training noise rates (patients 0.3, exam results
0.1) and with every patient noisy and half the exam results (like its all-noise test split), under both
reward profiles (medexagent, the default, and strict); then MedExAgent's two evaluation protocols
(`--protocol conversation` and `diagnosis`) on the clean cases, with the metrics its evaluation reports.

    .venv/bin/python scripts/clinic_acceptance.py --cases 600 --out bench-out/clinic

Generates the cases, builds one bank per noise level (all cases in one split), starts `case-env serve` on
loopback, runs `case-env eval`'s runner for both agents on every bank, and writes acceptance.json and one
report.html with every run on the cost-accuracy plot.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from case_env.bench.process import ServerProcess
from case_env.core import registry
from case_env.core.bank import write
from case_env.envs.clinic.bank import build
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.reward import RewardWeights
from case_env.envs.clinic.synth import make_cases, write_csv
from case_env.eval.report import write_report
from case_env.eval.runner import run_eval

LEVELS = {"clean": (0.0, 0.0), "training noise": (0.3, 0.1), "all noise": (1.0, 0.5)}
AGENTS = ("clinician", "no-exam")
PROTOCOL_FIGURES = (
    "reward",
    "accuracy_strict",
    "accuracy_lenient",
    "diagnosis_jaccard",
    "tool_match",
    "diagnosis_found",
    "tool_hallucination_rate",
    "num_tool_calls",
    "turns",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=300, help="Synthetic cases (10 per condition per 300).")
    parser.add_argument("--seed", type=int, default=0, help="Case seed.")
    parser.add_argument("--noise-seed", type=int, default=42, help="Noise seed.")
    parser.add_argument("--out", type=Path, default=Path("bench-out/clinic"), help="Output directory.")
    parser.add_argument(
        "--profiles",
        nargs="+",
        default=["medexagent", "strict"],
        help="Reward profiles to run (default both).",
    )
    args = parser.parse_args()
    root = args.out / "root"
    cases = make_cases(args.cases, args.seed)
    write_csv(cases, root / "clinic" / "clinic_synthetic.csv")
    started = time.perf_counter()
    figures: dict[str, dict] = {}
    runs = []
    with ServerProcess(
        args.out / "server.log",
        {"CASE_ENV_DATA_ROOT": str(root), "CASE_ENV_CLINIC_CASES": None, "CASE_ENV_TOKEN": None},
    ) as server:
        print(
            f"{'profile':10s} {'agent':10s} {'noise':15s} {'reward':>6s} {'strict':>6s} {'lenient':>7s} "
            f"{'tool':>5s} {'cost':>5s} {'exam$':>6s} {'exams':>5s} {'n':>4s}"
        )
        for profile in args.profiles:
            weights = RewardWeights(profile=profile)
            for level, (patient, exam) in LEVELS.items():
                noise = NoiseConfig(seed=args.noise_seed, patient_rate=patient, exam_rate=exam)
                name = f"{profile}-{level.replace(' ', '-')}"
                bank = args.out / "banks" / name
                write(
                    build(cases, args.seed, (1.0, 0.0, 0.0), noise, weights),
                    bank,
                    {"env": "clinic", "noise": noise.model_dump(), "reward": weights.model_dump()},
                )
                for agent in AGENTS:
                    out = args.out / "runs" / f"{name}-{agent}"
                    (out / "trajectories.jsonl").unlink(missing_ok=True)  # a fresh run each time
                    # the `noisy` protocol plays the bank's noise plan and personas (MedExAgent's own
                    # protocols inject no noise)
                    results = run_eval(
                        bank / "train.parquet", server.url, agent, out, progress=False, protocol="noisy"
                    )
                    figures[f"{profile} / {agent} / {level}"] = {
                        "overall": results["overall"],
                        "by_noise": results["by_noise"],
                    }
                    runs.append((f"{agent}, {level}, {profile}", results))
                    o = results["overall"]
                    print(
                        f"{profile:10s} {agent:10s} {level:15s} {o['reward']:6.3f} {o['accuracy_strict']:6.3f} "
                        f"{o['accuracy_lenient']:7.3f} {o['tool_match']:5.2f} {o['cost']:5.2f} "
                        f"{o['tool_cost_total']:6.2f} {o['exams']:5.2f} {o['n']:4d}"
                    )
        # MedExAgent's two evaluation protocols on the clean bank of the default profile: our figures and the
        # metrics its evaluation reports (diagnosis Jaccard = its diagnosis_reward, the ToolRL score = its
        # tool_call_reward, diagnosis_found, tool_hallucination_rate, num_tool_calls), side by side
        protocols = {}
        clean = args.out / "banks" / f"{args.profiles[0]}-clean" / "train.parquet"
        print(
            f"\n{'protocol':12s} {'agent':10s} "
            + " ".join(f"{k:>{max(len(k), 6)}s}" for k in PROTOCOL_FIGURES)
        )
        for protocol in ("conversation", "diagnosis"):
            for agent in AGENTS:
                out = args.out / "runs" / f"{protocol}-{agent}"
                (out / "trajectories.jsonl").unlink(missing_ok=True)
                o = run_eval(clean, server.url, agent, out, progress=False, protocol=protocol)["overall"]
                protocols[f"{protocol} / {agent}"] = {k: o[k] for k in PROTOCOL_FIGURES}
                print(
                    f"{protocol:12s} {agent:10s} "
                    + " ".join(f"{o[k]:>{max(len(k), 6)}.3f}" for k in PROTOCOL_FIGURES)
                )
    write_report(args.out, registry.get("clinic"), runs, [])
    summary = {
        "cases": args.cases,
        "seed": args.seed,
        "noise_seed": args.noise_seed,
        "levels": {k: {"patient_rate": v[0], "exam_rate": v[1]} for k, v in LEVELS.items()},
        "profiles": args.profiles,
        "seconds": round(time.perf_counter() - started, 1),
        "runs": figures,
        "protocols": protocols,
    }
    (args.out / "acceptance.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out / 'acceptance.json'} and {args.out / 'report.html'}")


if __name__ == "__main__":
    main()
