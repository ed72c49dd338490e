"""Packaging a user can install: the wheel built from this repository, installed non-editably (with its declared
dependencies, from the package index) into a fresh virtual environment, runs without the repository:
`case-env --help`, `case-env envs`, synthetic data for each environment and one tool call of each through
the app factory."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

from tests.verl_rows import REPO

CALLS = {
    "imaging": ("list_visits", {}),
    "clinic": ("ask_patient", {"question": "What brings you in?"}),
    "casereason": ("submit_diagnosis", {"diagnosis": "gout"}),
}

SCRIPT = """
import json, sys
from pathlib import Path
from fastapi.testclient import TestClient
from case_env.server.app import create_app
from case_env.server.settings import ServerSettings
from case_env.settings import DataSettings

root, calls = Path(sys.argv[1]), json.loads(sys.argv[2])
app = create_app(ServerSettings(), DataSettings(data_root=root, cache_dir=root.parent / "cache"))
out = {}
with TestClient(app) as client:
    stores = app.state.server.cases
    for env, (tool, arguments) in calls.items():
        case = stores[env].ids()[0]
        body = {"episode_id": f"wheel-{env}", "patient_id": case, "arguments": arguments}
        out[env] = client.post(f"/v1/tools/{tool}", json=body).json()
print(json.dumps(out))
"""


def _run(*command: str, cwd=None) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=cwd)
    assert done.returncode == 0, f"{command}: {done.stderr[-3000:]}"
    return done.stdout


def test_the_wheel_installs_and_runs_without_the_repository(tmp_path):
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(REPO))
    (wheel,) = (tmp_path / "dist").glob("case_env-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for package in (
        "case_env/envs/casereason/",
        "case_env/tools/clinic/",
        "case_env/personas/imaging/",
        "case_env/core/",
        "case_env/medicine/",
        "case_env/envs/imaging/ukb/",
        "case_env/envs/imaging/bench/",
    ):
        assert any(n.startswith(package) for n in names), package
    assert not any(n.startswith(("tests/", "examples/", "tools/", "personas/")) for n in names)
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", str(venv))
    python, cli = str(venv / "bin" / "python"), str(venv / "bin" / "case-env")
    _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[ukb]")
    work = tmp_path / "elsewhere"  # not the repository: nothing can be imported from its folders
    work.mkdir()
    assert "Usage: case-env" in _run(cli, "--help", cwd=work)
    # the chat templates `case-env train` gives verl are package data
    shipped = "from case_env.lm.chat_templates import FAMILIES, template; print(template(FAMILIES['qwen3']))"
    assert "<tool_response>" in _run(python, "-c", shipped, cwd=work)
    listed = json.loads(_run(cli, "envs", "--json", cwd=work))
    assert set(listed["environments"]) >= set(CALLS) and listed["problems"] == []
    root = work / "root"
    _run(cli, "synth", "--out", str(root), "--patients", "1", "--jobs", "1", cwd=work)
    _run(cli, "synth", "--env", "clinic", "--out", str(root), "--patients", "30", cwd=work)
    _run(cli, "synth", "--env", "casereason", "--out", str(root), "--patients", "30", cwd=work)
    replies = json.loads(_run(python, "-c", SCRIPT, str(root), json.dumps(CALLS), cwd=work))
    for env, reply in replies.items():
        assert reply["ok"], (env, reply)
    assert "baseline (" in replies["imaging"]["text"] and "follow_up (" in replies["imaging"]["text"]
    assert replies["casereason"]["text"].startswith(("Incorrect", "Correct"))
    # the real-data path of an installed wheel: UK Biobank-style zips of the patient, ingested back
    _run(cli, "synth", "--format", "ukb-dicom", "--source", str(root), "--out", str(work / "zips"), cwd=work)
    ingested = _run(cli, "ingest", "ukb", "--zips", str(work / "zips"), "--out", str(work / "ukb"), cwd=work)
    assert "2 visits written" in ingested
