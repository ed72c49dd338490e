"""The case-reasoning environment through verl 0.9.1's real classes on CPU: sequential-attempt rows through
RLHFDataset and the stock ToolAgentLoop, `submit_diagnosis` through CaseTool (which carries the attempt
budget and the submissions), verl's reward manager scoring with the case-reasoning reward; the HTTP eval
runner agrees on every case."""

from __future__ import annotations

import asyncio
import json

import pytest
from verl.tools.tool_registry import load_all_tools

from case_env.core.bank import write
from case_env.envs.casereason.bank import build
from case_env.envs.casereason.cases import read_file
from case_env.envs.casereason.synth import write_cases
from case_env.eval.runner import run_eval
from case_env.verl.config import path_for
from case_env.verl.dataset import CaseRLHFDataset
from case_env.verl.offline import build_tokenizer
from case_env.verl.rollouts import play
from tests.server_harness import live_server
from tests.test_clinic_server import env
from tests.verl_rows import REPO, dataset_config

K = 5


def test_sequential_rows_through_tool_agent_loop_and_reward_manager(dataset, tmp_path, monkeypatch):
    write_cases(24, 0, tmp_path / "cases" / "c.jsonl")
    cases = read_file(tmp_path / "cases" / "c.jsonl").cases
    write(build(cases, 0, (1.0, 0.0, 0.0), "sequential", K), tmp_path / "bank", {})
    with env(CASE_ENV_CASEREASON_CASES=tmp_path / "cases"), live_server(dataset, tmp_path) as server:
        monkeypatch.setenv("CASE_ENV_URL", server.url)
        tools = load_all_tools(tool_config_path=str(REPO / path_for("casereason")), function_tool_path=None)
        data = CaseRLHFDataset(
            data_files=[str(tmp_path / "bank" / "train.parquet")],
            tokenizer=build_tokenizer(),
            config=dataset_config(),
            processor=None,
        )
        items = [data[i] for i in range(len(data))]
        assert all(i["agent_name"] == "tool_agent" for i in items)
        assert items[0]["tools_kwargs"]["submit_diagnosis"]["create_kwargs"]["attempts"] == K

        outputs, models, scores = asyncio.run(play(items, tools, len(items)))
        run_eval(tmp_path / "bank" / "train.parquet", server.url, "reader", tmp_path / "eval", progress=False)
        lines = (tmp_path / "eval" / "trajectories.jsonl").read_text().splitlines()
        episodes = [r for r in map(json.loads, lines) if r["variant"] == "sequential"]
        by_id = {r["patient_id"]: r for r in episodes}
        correct = recall = 0
        for out, model, item, score in zip(outputs, models, items, scores, strict=True):
            extra = score["reward_extra_info"]
            assert set(extra) == {
                "score",
                "acc",
                "pred",
                "format_ok",
                "judge",
                "judge_fallback",
                "credit",
                "recall",
                "attempts",
                "first_correct",
                "infra_error",
                "calls_dropped",
            }
            calls = out.extra_fields["case_env_tool_calls"]
            submissions = [c["arguments"]["diagnosis"] for c in calls if c["tool"] == "submit_diagnosis"]
            assert 1 <= len(submissions) <= K and extra["attempts"] >= len(submissions)
            assert (
                '"name": "submit_diagnosis"' in model.prompts[0]
                and '"name": "order_exam"' not in model.prompts[0]
            )
            if extra["acc"]:
                assert "Correct. Give this diagnosis" in model.prompts[-1]
                assert extra["first_correct"] == len(submissions)
                assert score["reward_score"] == pytest.approx(1 - (len(submissions) - 1) / K, abs=1e-6)
            correct += extra["acc"]
            direct = by_id[item["extra_info"]["patient_id"]]["score"]  # the eval runner's episode
            assert (direct["acc"], direct["first_correct"]) == (extra["acc"], extra["first_correct"])
            assert 0 <= extra["recall"] <= 1
            recall += extra["recall"]
        assert correct / len(items) >= 0.9 and recall / len(items) > 0.2
