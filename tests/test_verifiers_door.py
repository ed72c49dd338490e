"""case-env as a verifiers environment: the `case-env-verifiers` taskset (integrations/verifiers), run by
verifiers' own `vf-eval` in its own environment (verifiers pins mcp 2.0 and openai below 3), against a live
server's MCP door and a scripted OpenAI-compatible model. The model's calls reach the row's episode, images
arrive as image parts, and the reward is the one the same calls and answer earn through the door directly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from case_env.core.bank import load_items
from tests.chat_stub import ScriptedChat
from tests.server_harness import live_server, serve_app

TOKEN = "verifiers-token-0123456789"
VENV = Path(__file__).resolve().parents[1] / ".venv-verifiers"
SLICE = {"visit": "baseline", "sequence": "fat", "plane": "axial"}


@pytest.fixture(scope="module")
def server(dataset, bank, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verifiers-server")
    with live_server(dataset, tmp, protocols="verl,mcp", banks=[bank], token=TOKEN) as live:
        yield live


def answer_for(rows: list, messages: list[dict]) -> str:
    """The first row's answer is its ground truth, the second's a wrong letter."""
    user = next(m["content"] for m in messages if m["role"] == "user")
    index = next(i for i, item in enumerate(rows) if item.prompt[-1]["content"] == user)
    truth = rows[index].ground_truth
    return f"<answer>{truth if index == 0 else ('A' if truth != 'A' else 'B')}</answer>"


def vf_eval(out: Path, server, chat_url: str, token: str | None) -> subprocess.CompletedProcess:
    if not (VENV / "bin" / "vf-eval").exists():
        pytest.fail(f"{VENV} is missing: `make test` builds it (verifiers and case-env-verifiers)")
    env = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}", "STUB_KEY": "unused"}
    env.pop("CASE_ENV_TOKEN", None)
    env |= {"CASE_ENV_TOKEN": token} if token else {}
    command = [
        "vf-eval", "case-env-verifiers", "-n", "2", "-m", "scripted", "--no-push", "-o", str(out),
        "--client.base-url", chat_url, "--client.api-key-var", "STUB_KEY",
        "--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", "null",
        "--env.taskset.task.door.server", server.url, "--env.taskset.split", "test",
    ]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def door_reward(server, row: str, answer: str) -> dict:
    """The same calls and answer through the MCP door with the official SDK: the reward verifiers must match."""

    async def episode():
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"})
        async with Client(streamable_http_client(f"{server.url}/mcp/imaging/", http_client=http)) as mcp:
            started = (await mcp.call_tool("start_episode", {"row": row})).structured_content
            episode = {"episode_id": started["episode_id"]}
            await mcp.call_tool("list_visits", episode)
            await mcp.call_tool("render_slice", episode | SLICE)
            done = await mcp.call_tool("finish_episode", episode | {"answer": answer})
            return done.structured_content

    return asyncio.run(episode())


def test_vf_eval_plays_bank_rows_through_the_door_and_scores_them_as_case_env(server, bank, tmp_path):
    rows = [item for item in load_items(bank) if item.key.startswith("test-")][:2]

    def reply(messages: list[dict]):
        tools_seen = sum(m["role"] == "tool" for m in messages)
        if tools_seen < 2:
            name, arguments = ("list_visits", {}) if tools_seen == 0 else ("render_slice", SLICE)
            call = {
                "id": f"call-{tools_seen}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        return answer_for(rows, messages)

    chat = ScriptedChat(reply)
    with serve_app(chat.app) as model:
        run = vf_eval(tmp_path / "out", server, f"{model.url}/v1", TOKEN)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    traces = [json.loads(line) for path in tmp_path.glob("out/*/traces.jsonl") for line in path.open()]
    by_row = {t["task"]["data"]["row"]: t["traces"][0] for t in traces}
    assert sorted(by_row) == sorted(item.key for item in rows)

    for index, item in enumerate(rows):
        trace = by_row[item.key]
        assert trace["ok"] and not trace["errors"], trace["errors"]
        answer = answer_for(rows, [{"role": "user", "content": item.prompt[-1]["content"]}])
        expected = door_reward(server, item.key, answer)
        assert trace["rewards"]["case_env"]["score"] == pytest.approx(expected["score"])
        assert trace["metrics"]["acc"] == (1.0 if index == 0 else 0.0) == expected["acc"]

    # what the model was offered and shown: the row's persona's tools, the tool's text, the slice as an image
    first = [r for r in chat.requests if r["messages"][1]["content"] == rows[0].prompt[-1]["content"]]
    offered = sorted(t["function"]["name"] for t in first[0]["tools"])
    assert offered == sorted(rows[0].extra["tool_selection"])
    tool_turns = [m for m in first[-1]["messages"] if m["role"] == "tool"]
    assert "visit(s)" in json.dumps(tool_turns[0]["content"])
    shown = json.dumps(first[-1]["messages"])
    assert "data:image/png;base64," in shown


def test_vf_eval_without_the_token_is_refused_with_the_reason(server, tmp_path):
    run = vf_eval(tmp_path / "out", server, "http://127.0.0.1:9/v1", None)
    assert run.returncode != 0
    shown = run.stdout + run.stderr
    assert "refused the rows (401)" in shown and "set CASE_ENV_TOKEN to the server's token" in shown
