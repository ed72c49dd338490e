"""Check 16 (issue 31): schemathesis' own run, every check, a fixed seed, over every route of every hosted
environment (one path per tool in /openapi.json) and every door's documented routes (OpenEnv's, MCP's and
the bank rows), with real ids supplied by a hook: 0 failures.

Unlike check 1 (`test_fuzz.py`, schemathesis' Python API driven by this suite's strategies), this is the CLI
a user would run, with all its phases (examples, coverage, fuzzing, stateful) and checks, the statuses the
server documents beside schemathesis' lists in `schemathesis.toml`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from case_env.envs.casereason.synth import write_cases
from case_env.envs.clinic.synth import make_cases, write_csv
from tests.reliability.conftest import size
from tests.server_harness import live_server
from tests.test_clinic_server import env
from tests.verl_rows import REPO

TOKEN = "schemathesis-token-0123456789"
HERE = Path(__file__).parent


def test_schemathesis_reports_no_failures(dataset, bank, tmp_path, figures):
    write_csv(make_cases(20, 0), tmp_path / "clinic" / "clinic_synthetic.csv")
    write_cases(12, 0, tmp_path / "casereason" / "cases.jsonl")
    doors = {"protocols": "verl,openenv,mcp", "banks": [bank]}
    with (
        env(CASE_ENV_CLINIC_CASES=tmp_path / "clinic", CASE_ENV_CASEREASON_CASES=tmp_path / "casereason"),
        live_server(dataset, tmp_path / "srv", token=TOKEN, **doors) as server,
    ):
        state = server.state
        ids = {
            "tools": {tool: sorted(state.cases[owner].ids())[:8] for tool, owner in state.tool_env.items()}
        }
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "--config-file",
                str(HERE / "schemathesis.toml"),
                "run",
                f"{server.url}/openapi.json",
                "--checks",
                "all",
                "--seed",
                "31",
                "--max-examples",
                str(size(ci=4, full=40)),
                "-H",
                f"Authorization: Bearer {TOKEN}",
                "--no-color",
            ],
            env={
                **os.environ,
                "SCHEMATHESIS_HOOKS": "tests.reliability.schemathesis_hooks",
                "CASE_ENV_FUZZ_IDS": json.dumps(ids),
                "PYTHONPATH": str(REPO),
            },
            capture_output=True,
            text=True,
            timeout=1800,
        )
    out = done.stdout
    summary = re.search(r"(\d+) generated, (.*)", out)
    figures["requests"] = int(summary.group(1)) if summary else None
    figures["summary"] = summary.group(0) if summary else out[-500:]
    failures = re.search(r"(\d+) failures?", out.splitlines()[-1] if out else "")
    figures["failures"] = int(failures.group(1)) if failures else 0
    (tmp_path.parent / "schemathesis.out").write_text(out)
    assert done.returncode == 0, out[-6000:] + done.stderr[-2000:]
    assert summary and int(summary.group(1)) >= size(ci=3000, full=12000)
    assert (
        "Missing test data" not in out
        or "repeatedly returned 404" not in out.split("Missing test data")[1][:200]
    )
