"""A real model served by transformers' own OpenAI-compatible server (`transformers serve`), evaluated by
`case-env eval --agent openai` on every environment against a live case-env server; the recorded run replays
through `case-env serve --replay`: the same model against the replayed tools writes the same trajectories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from case_env.bench.process import ServerProcess, free_port

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def served(tuned, tmp_path_factory):
    """The tuned SmolLM2 under `transformers serve` on a free loopback port."""
    port = free_port()
    log = tmp_path_factory.mktemp("transformers-serve") / "serve.log"
    command = [str(BIN / "transformers"), "serve", str(tuned), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--device", "cpu", "--default-seed", "0"]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 180
    body = {"model": str(tuned), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    while True:
        try:
            if httpx.post(f"{url}/chat/completions", json=body, timeout=60).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)
    yield url, str(tuned)
    os.killpg(process.pid, 15)
    process.wait(timeout=30)


def evaluate(bank: Path, server: str, model: tuple[str, str], out: Path) -> subprocess.CompletedProcess:
    url, name = model
    command = [str(BIN / "case-env"), "eval", "--bank", str(bank), "--server", server, "--agent", "openai"]
    command += ["--model-url", url, "--model", name, "--out", str(out), "--limit", "2", "--concurrency", "2"]
    command += ["--max-tokens", "96", "--max-turns", "4", "--temperature", "0", "--greedy-samples"]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


def test_eval_over_transformers_serve_and_its_replay(world, served, tmp_path):
    """Imaging rows, whose tuned model writes calls (in its text: transformers serve has no parser for
    ChatML models' calls); every environment's figures come from the same command (docs/models.md)."""
    bank = world.banks["imaging"] / "train.parquet"
    live = evaluate(bank, world.url, served, tmp_path / "live")
    assert live.returncode == 0, live.stderr[-3000:]
    results = json.loads((tmp_path / "live" / "results.json").read_text())
    records = [
        json.loads(line) for line in (tmp_path / "live" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert len(records) >= 2 and results["env"] == "imaging"
    assert any("<tool_call>" in (m.get("content") or "") for r in records for m in r["messages"])
    assert (tmp_path / "live" / "report.html").is_file()
    assert all(r["messages"][-1]["role"] == "assistant" for r in records)  # the model's own turns
    # the same model against `case-env serve --replay` of this run: the tools answer from the recording
    replay = ServerProcess(
        tmp_path / "replay.log",
        {"CASE_ENV_REPLAY_DIR": str(tmp_path / "live"), "CASE_ENV_TOKEN": None, "CASE_ENV_DATA_ROOT": None},
    )
    replay.start()
    try:
        again = evaluate(bank, replay.url, served, tmp_path / "replayed")
    finally:
        replay.stop()
    assert again.returncode == 0, again.stderr[-3000:]
    replayed = [
        json.loads(line) for line in (tmp_path / "replayed" / "trajectories.jsonl").read_text().splitlines()
    ]

    def conversation(record: dict) -> list:
        return [(m["role"], m.get("content"), m.get("tool_calls")) for m in record["messages"]]

    by_row = {r["id"]: conversation(r) for r in records}
    assert {r["id"]: conversation(r) for r in replayed} == by_row
