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

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from case_env.bench.process import ServerProcess
from case_env.core import registry
from case_env.core.bank import write
from case_env.core.commands import run
from case_env.envs.clinic.bank import build
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.reward import RewardRules
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


def main(
    cases: Annotated[int, typer.Option(help="Synthetic cases (10 per condition per 300).")] = 300,
    seed: Annotated[int, typer.Option(help="Case seed.")] = 0,
    noise_seed: Annotated[int, typer.Option(help="Noise seed.")] = 42,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("bench-out/clinic"),
    profiles: Annotated[
        list[str],
        typer.Option(
            "--profile", metavar="PROFILE", help="A reward profile to run (repeat the option for several)."
        ),
    ] = ["medexagent", "strict"],  # noqa: B006 (typer reads the default, never mutates it)
) -> None:
    """Run the clinic acceptance comparison."""
    root = out / "root"
    made = make_cases(cases, seed)
    write_csv(made, root / "clinic" / "clinic_synthetic.csv")
    started = time.perf_counter()
    figures: dict[str, dict] = {}
    runs = []
    with ServerProcess(
        out / "server.log",
        {"CASE_ENV_DATA_ROOT": str(root), "CASE_ENV_CLINIC_CASES": None, "CASE_ENV_TOKEN": None},
    ) as server:
        print(
            f"{'profile':10s} {'agent':10s} {'noise':15s} {'reward':>6s} {'strict':>6s} {'lenient':>7s} "
            f"{'tool':>5s} {'cost':>5s} {'exam$':>6s} {'exams':>5s} {'n':>4s}"
        )
        for profile in profiles:
            rules = RewardRules(profile=profile)
            for level, (patient, exam) in LEVELS.items():
                noise = NoiseConfig(seed=noise_seed, patient_rate=patient, exam_rate=exam)
                name = f"{profile}-{level.replace(' ', '-')}"
                bank = out / "banks" / name
                write(
                    build(made, seed, (1.0, 0.0, 0.0), noise, rules),
                    bank,
                    {"env": "clinic", "noise": noise.model_dump(), "reward": rules.model_dump()},
                )
                for agent in AGENTS:
                    run_dir = out / "runs" / f"{name}-{agent}"
                    (run_dir / "trajectories.jsonl").unlink(missing_ok=True)  # a fresh run each time
                    # the `noisy` protocol plays the bank's noise plan and personas (MedExAgent's own
                    # protocols inject no noise)
                    results = run_eval(
                        bank / "train.parquet", server.url, agent, run_dir, progress=False, protocol="noisy"
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
        clean = out / "banks" / f"{profiles[0]}-clean" / "train.parquet"
        print(
            f"\n{'protocol':12s} {'agent':10s} "
            + " ".join(f"{k:>{max(len(k), 6)}s}" for k in PROTOCOL_FIGURES)
        )
        for protocol in ("conversation", "diagnosis"):
            for agent in AGENTS:
                run_dir = out / "runs" / f"{protocol}-{agent}"
                (run_dir / "trajectories.jsonl").unlink(missing_ok=True)
                o = run_eval(clean, server.url, agent, run_dir, progress=False, protocol=protocol)["overall"]
                protocols[f"{protocol} / {agent}"] = {k: o[k] for k in PROTOCOL_FIGURES}
                print(
                    f"{protocol:12s} {agent:10s} "
                    + " ".join(f"{o[k]:>{max(len(k), 6)}.3f}" for k in PROTOCOL_FIGURES)
                )
    write_report(out, registry.get("clinic"), runs, [])
    summary = {
        "cases": cases,
        "seed": seed,
        "noise_seed": noise_seed,
        "levels": {k: {"patient_rate": v[0], "exam_rate": v[1]} for k, v in LEVELS.items()},
        "profiles": profiles,
        "seconds": round(time.perf_counter() - started, 1),
        "runs": figures,
        "protocols": protocols,
    }
    (out / "acceptance.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'acceptance.json'} and {out / 'report.html'}")


if __name__ == "__main__":
    run(main)
