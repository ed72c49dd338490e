"""A new environment is one package: `examples/triage` (its own pyproject with an entry point, one tool, one
persona, a bank builder, a reward) is pip-installed into the test environment, listed by `case-env envs`,
built into a bank by `case-env`, served beside the built-in environments, and played through verl's
ToolAgentLoop and CaseTool to a reward by verl's reward manager."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from case_env.core import registry
from tests.server_harness import live_server
from tests.verl_rows import REPO

EXAMPLE = REPO / "examples" / "triage"


def _pip(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


def _cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "case_env.cli", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def installed():
    # a copy, so the build writes nothing (egg-info, build/) into the repository
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "triage"
        subprocess.run(["cp", "-r", str(EXAMPLE), str(source)], check=True)
        _pip("install", "--no-deps", "--no-build-isolation", str(source))
    registry.reload()
    try:
        yield registry.get("triage")
    finally:
        _pip("uninstall", "-y", "case-env-triage")
        registry.reload()


def test_the_example_is_listed_built_served_and_played_through_verl(
    installed, dataset, tmp_path, monkeypatch
):
    from verl.tools.tool_registry import load_all_tools

    from case_env.verl.config import write
    from case_env.verl.dataset import CaseRLHFDataset
    from case_env.verl.offline import build_tokenizer
    from case_env.verl.rollouts import play
    from tests.verl_rows import dataset_config

    listed = json.loads(_cli("envs", "--json"))["environments"]
    assert listed["triage"]["personas"] == {"nurse": ["triage_vitals"]} and listed["triage"]["tools"] == [
        "read_vitals"
    ]
    root = tmp_path / "root"
    _cli("synth", "--env", "triage", "--out", str(root), "--patients", "20")
    _cli("bank", "build", "--env", "triage", "--data-root", str(root), "--out", str(tmp_path / "bank"))
    assert "problem" not in _cli("bank", "validate", str(tmp_path / "bank" / "train.parquet"))

    with live_server(root, tmp_path / "srv") as server:
        tools = httpx.get(f"{server.url}/v1/tools", params={"env": "triage"}, timeout=10).json()["tools"]
        assert [t["name"] for t in tools] == ["read_vitals"]
        reply = httpx.post(
            f"{server.url}/v1/tools/read_vitals",
            timeout=10,
            json={"episode_id": "t1", "patient_id": "triage-0001", "arguments": {}},
        ).json()
        assert reply["ok"] and reply["text"].startswith("Heart rate ")
        other = httpx.post(
            f"{server.url}/v1/tools/ask_patient",
            timeout=10,
            json={"episode_id": "t2", "patient_id": "triage-0001", "arguments": {"question": "hi"}},
        ).json()
        assert other["error"]["code"] == "not_available"  # another environment's tool, refused by name

        monkeypatch.setenv("CASE_ENV_URL", server.url)
        config = write(installed, tmp_path / "triage.yaml")
        verl_tools = load_all_tools(tool_config_path=str(config), function_tool_path=None)
        data = CaseRLHFDataset(
            data_files=[str(tmp_path / "bank" / "train.parquet")],
            tokenizer=build_tokenizer(),
            config=dataset_config(),
            processor=None,
        )
        items = [data[i] for i in range(len(data))]
        outputs, _models, scores = asyncio.run(play(items, verl_tools, 8))
    assert len(items) >= 10
    for out, item, score in zip(outputs, items, scores, strict=True):
        calls = out.extra_fields["case_env_tool_calls"]
        assert [c["tool"] for c in calls] == ["read_vitals"] and calls[0]["status"] == "ok"
        assert (
            score["reward_score"] == 1.0
            and score["reward_extra_info"]["pred"] == item["reward_model"]["ground_truth"]
        )
    assert {item["reward_model"]["ground_truth"] for item in items} == {"urgent", "routine"}
