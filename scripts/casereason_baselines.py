#!/usr/bin/env python3
"""The case-reasoning environment's scripted baselines: accuracy at 1, 5 and 10 attempts (independent
samples and sequential feedback) and reasoning recall, for the `reader` (reads the whole presentation,
results included) and the `symptoms` reader (ignores results), on original synthetic cases.

    .venv/bin/python scripts/casereason_baselines.py --cases 300 --out bench-out/casereason

Writes the cases, builds a bank (all cases in one split), starts `case-env serve` on loopback for the
`submit_diagnosis` tool, runs `case-env eval`'s runner for both baselines and writes baselines.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from case_env.bench.process import ServerProcess
from case_env.core.bank import write
from case_env.core.commands import run
from case_env.envs.casereason.bank import build
from case_env.envs.casereason.cases import read_file
from case_env.envs.casereason.synth import write_cases
from case_env.eval.runner import run_eval


def main(
    cases: Annotated[int, typer.Option(help="Synthetic cases.")] = 150,
    seed: Annotated[int, typer.Option(help="Case seed.")] = 0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("bench-out/casereason"),
) -> None:
    """Run the case-reasoning baselines."""
    root = out / "root"
    write_cases(cases, seed, root / "casereason" / "casereason_synthetic.jsonl")
    presentations = read_file(root / "casereason" / "casereason_synthetic.jsonl").cases
    write(build(presentations, seed, (1.0, 0.0, 0.0)), out / "bank", {"env": "casereason"})
    started, figures = time.perf_counter(), {}
    with ServerProcess(
        out / "server.log",
        {"CASE_ENV_DATA_ROOT": str(root), "CASE_ENV_CASEREASON_CASES": None, "CASE_ENV_TOKEN": None},
    ) as server:
        for agent in ("reader", "symptoms"):
            (out / agent / "trajectories.jsonl").unlink(missing_ok=True)  # a fresh run each time
            results = run_eval(out / "bank" / "train.parquet", server.url, agent, out / agent, progress=False)
            figures[agent] = results["overall"]
            o = results["overall"]
            for mode in ("independent", "sequential"):
                a = o[mode]
                print(
                    f"{agent:9s} {mode:12s} acc@1 {a['acc@1']:.3f} acc@5 {a['acc@5']:.3f} acc@10 {a['acc@10']:.3f} "
                    f"recall {o['recall']:.3f} (n={o['n']})"
                )
    summary = {
        "cases": cases,
        "seed": seed,
        "seconds": round(time.perf_counter() - started, 1),
        "baselines": figures,
    }
    (out / "baselines.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'baselines.json'}")


if __name__ == "__main__":
    run(main)
