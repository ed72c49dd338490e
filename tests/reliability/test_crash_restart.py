"""Check 6: the server dies (SIGKILL) while verl's ToolAgentLoop runs many trajectories through CaseTool,
and comes back on the same port.

Each trajectory is a bank row played by a scripted policy that takes a little time per turn, as a model
would, so calls are in flight when the server dies. The adapter retries connection errors with backoff
(its default settings); since tools are pure, a retried call answers exactly as the first would have.
Afterwards: every trajectory came back once, with every tool output exactly once and equal to what the
restarted server answers for the same call, no infrastructure error reached the model, and verl's reward
manager scores every trajectory 1.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
from verl.tools.tool_registry import load_all_tools

from case_env.bench.process import ServerProcess
from case_env.verl.config import path_for
from case_env.verl.offline import (
    ScriptedModel,
    build_processor,
    build_tokenizer,
    loop_config,
    make_loop,
    run_row,
    score_with_verl,
)
from tests.reliability.conftest import size
from tests.verl_rows import REPO, build_bank, rows, script_for


class ThinkingModel(ScriptedModel):
    """A scripted policy that spends a random moment on each turn, like a model generating."""

    def __init__(self, tokenizer, script: list[str], rng: random.Random, progress: list[int]):
        super().__init__(tokenizer, lambda text, images, turn: script[turn])
        self.rng, self.progress = rng, progress

    async def generate(self, request_id, **kw):
        if self.prompts:
            self.progress[0] += 1  # a tool call came back
        await asyncio.sleep(self.rng.uniform(0.05, 0.4))
        return await super().generate(request_id, **kw)


def test_crash_and_restart(dataset, tmp_path, figures, monkeypatch):
    items = rows(build_bank(dataset, tmp_path / "bank"), per_source=size(ci=6, full=24))
    scripts = [script_for(item, correct=True) for item in items]
    total_calls = sum(len(s) - 1 for s in scripts)
    env = {
        "CASE_ENV_DATA_ROOT": str(dataset),
        "CASE_ENV_CACHE_DIR": str(tmp_path / "cache"),
        "CASE_ENV_EPISODE_DB": str(tmp_path / "episodes.sqlite"),
        "CASE_ENV_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        "CASE_ENV_TOKEN": None,
    }
    server = ServerProcess(tmp_path / "server.log", env).start()
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    tools = load_all_tools(tool_config_path=str(REPO / path_for("imaging")), function_tool_path=None)
    progress = [0]
    crash: dict = {}

    async def one(i: int, item: dict):
        tokenizer = build_tokenizer()
        model = ThinkingModel(tokenizer, scripts[i], random.Random(i), progress)
        loop = make_loop(
            tools, model, processor=build_processor(tokenizer), config=loop_config(max_turns=len(scripts[i]))
        )
        out = await run_row(loop, item)
        return out, model

    async def run():
        tasks = [asyncio.create_task(one(i, item)) for i, item in enumerate(items)]
        while progress[0] < total_calls // 3:  # a third of the calls done: the rest are in flight or ahead
            await asyncio.sleep(0.02)
        crash["calls_before"] = progress[0]
        server.kill()
        killed = time.monotonic()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)
        crash["downtime_s"] = round(time.monotonic() - killed, 2)
        results = await asyncio.gather(*tasks)
        scores = await score_with_verl(build_tokenizer(), [out for out, _ in results], items)
        return results, scores

    try:
        results, scores = asyncio.run(run())
        expected = _expected_outputs(server.url, items, scripts)
    finally:
        server.stop()

    completed = wrong = duplicated = infra = retried = 0
    for (out, model), score, answers in zip(results, scores, expected, strict=True):
        calls = out.extra_fields["case_env_tool_calls"]
        infra += sum(c["infra_error"] for c in calls)
        retried += sum(c["attempts"] > 1 for c in calls)
        final_prompt = model.prompts[-1]
        duplicated += final_prompt.count("<tool_response>") != len(answers)
        # each tool output reached the model in the turn after its call, as the server answers it now
        wrong += sum(answer[:300] not in model.prompts[k + 1] for k, answer in enumerate(answers))
        completed += len(calls) == len(answers) and score["reward_score"] == 1.0
    episodes = {
        json.loads(line)["episode_id"] for line in (tmp_path / "audit.jsonl").read_text().splitlines()
    }
    figures.update(
        {
            "trajectories": len(items),
            "trajectories_completed": completed,
            "tool_calls": total_calls,
            "calls_done_before_kill": crash["calls_before"],
            "server_downtime_s": crash["downtime_s"],
            "calls_retried": retried,
            "infra_errors_seen_by_model": infra,
            "wrong_tool_outputs": wrong,
            "duplicated_or_missing_outputs": duplicated,
            "episodes_in_audit": len(episodes),
        }
    )
    assert completed == len(items) and wrong == 0 and duplicated == 0 and infra == 0
    assert retried > 0  # the crash really hit calls in flight or about to be made
    # one episode per trajectory (its request id survives retries) plus one per verification replay
    assert len(episodes) == 2 * len(items)


def _expected_outputs(url: str, items: list[dict], scripts: list[list[str]]) -> list[list[str]]:
    """What the restarted server answers for each trajectory's calls, asked afresh in new episodes."""
    expected = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for i, (item, script) in enumerate(zip(items, scripts, strict=True)):
            answers = []
            for turn in script[:-1]:
                call = json.loads(turn.split("<tool_call>")[1].split("</tool_call>")[0])
                body = {
                    "episode_id": f"verify-{i}",
                    "patient_id": item["extra_info"]["patient_id"],
                    "arguments": call["arguments"],
                }
                payload = http.post(f"/v1/tools/{call['name']}", json=body).json()
                answers.append(payload["text"] if payload["ok"] else f"Error: {payload['text']}")
            expected.append(answers)
    return expected
