"""Contract tests against verl 0.9.1's real classes on CPU: tool YAML loading, RLHFDataset, ToolAgentLoop
with many concurrent trajectories of every persona against the live server, tool images into the model
input, rewards from verl's own reward manager, and the adapter's timeouts and retries."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.tools.tool_registry import load_all_tools
from verl.utils.dataset.rl_dataset import RLHFDataset

from case_env.core import registry
from case_env.core.calls import FORMATS, call_text
from case_env.envs.imaging import rubric
from case_env.envs.imaging.data.store import PatientStore
from case_env.reward import FAILURE_KEYS
from case_env.verl import CaseTool
from case_env.verl.config import path_for, render
from case_env.verl.dataset import CaseRLHFDataset
from case_env.verl.offline import (
    ScriptedModel,
    build_processor,
    build_tokenizer,
    loop_config,
    make_loop,
    run_row,
    score_with_verl,
)
from tests.server_harness import live_server
from tests.test_server_api import WITH_SLOW
from tests.verl_rows import REPO, build_bank, dataset_config, rows, script_for


@pytest.fixture(scope="module")
def bank(dataset, tmp_path_factory) -> Path:
    return build_bank(dataset, tmp_path_factory.mktemp("bank"))


@pytest.fixture(scope="module")
def server(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("verl-server")) as live:
        yield live


BUILT_IN = ("imaging", "clinic", "casereason")


@pytest.mark.parametrize("env", BUILT_IN)
def test_the_checked_in_tool_yaml_matches_the_environment(env):
    expected = render(registry.get(env))
    assert (REPO / path_for(env)).read_text() == expected, "run `case-env verl-config` and commit the result"


@pytest.mark.parametrize("env", BUILT_IN)
def test_verl_loads_one_case_tool_per_environment_tool(monkeypatch, env):
    monkeypatch.setenv("CASE_ENV_URL", "http://127.0.0.1:9")  # nothing listens: construction must not connect
    tools = load_all_tools(tool_config_path=str(REPO / path_for(env)), function_tool_path=None)
    assert sorted(t.name for t in tools) == sorted(registry.get(env).tools)
    assert all(isinstance(t, CaseTool) for t in tools)
    assert tools[0].settings.base_url == "http://127.0.0.1:9" and tools[0].settings.retries == 8
    for tool in tools:
        assert tool.get_openai_tool_schema().model_dump(exclude_none=True)["function"]["name"] == tool.name


def test_bank_rows_load_through_rlhf_dataset_with_tool_kwargs_intact(bank):
    data = CaseRLHFDataset(
        data_files=[str(bank / "train.parquet")],
        tokenizer=build_tokenizer(),
        config=dataset_config(),
        processor=None,
    )
    assert isinstance(data, RLHFDataset) and len(data) > 20
    tools = set(registry.get("imaging").tools)
    for i in range(len(data)):
        item = data[i]
        extra = item["extra_info"]
        assert item["agent_name"] == "tool_agent" and item["index"] == extra["index"]
        assert set(item["tools_kwargs"]) == tools
        assert {v["create_kwargs"]["patient_id"] for v in item["tools_kwargs"].values()} == {
            extra["patient_id"]
        }
        assert [m["role"] for m in item["raw_prompt"]] == ["system", "user"]
        assert item["reward_model"]["ground_truth"] == extra["ground_truth"]
        assert set(extra["tool_selection"]) <= tools


@pytest.mark.parametrize("form", FORMATS)
def test_concurrent_trajectories_of_every_persona(bank, server, dataset, monkeypatch, form):
    """Both of verl's tool-call parsers that Qwen models need: hermes JSON and qwen3_coder XML."""
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    tools = load_all_tools(tool_config_path=str(REPO / path_for("imaging")), function_tool_path=None)
    items = rows(bank, per_source=12)
    assert len(items) >= 32
    store = PatientStore(dataset)
    dates = {pid: store.patient(pid).visits[0].acq_date.isoformat() for pid in store.patient_ids()}

    async def one(i: int, item: dict):
        script = script_for(item, correct=i % 2 == 0, form=form)
        tokenizer = build_tokenizer()
        model = ScriptedModel(tokenizer, lambda text, images, turn: script[turn])
        loop = make_loop(
            tools,
            model,
            processor=build_processor(tokenizer),
            config=loop_config(max_turns=len(script), form=form),
        )
        out = await run_row(loop, item)
        return out, model, tokenizer

    async def run_all():
        results = await asyncio.gather(*[one(i, item) for i, item in enumerate(items)])
        scores = await score_with_verl(build_tokenizer(), [r[0] for r in results], items)
        return results, scores

    audited = len(server.state.settings.audit_log.read_text().splitlines())  # earlier tests' calls
    results, scores = asyncio.run(run_all())
    for i, ((out, model, _), item, score) in enumerate(zip(results, items, scores, strict=True)):
        patient = item["extra_info"]["patient_id"]
        seen = "\n".join(model.prompts[1:])
        assert dates[patient] in seen  # its own visits came back ...
        assert not [p for p, d in dates.items() if p != patient and d in seen]  # ... and no one else's
        calls = out.extra_fields["case_env_tool_calls"]
        assert len(calls) == len(item["extra_info"]["evidence"]) + 1
        assert not any(c["infra_error"] for c in calls)
        # Evidence calls succeed, except a claim's check of an organ the segmentation lacks (by design).
        assert all(
            c["status"] == "ok"
            or (c["status"] == "unknown_organ" and item["extra_info"]["template"] == "claim")
            for c in calls
        ), calls
        assert score["reward_score"] == (1.0 if i % 2 == 0 else 0.0)
        # the letter's keys and CASE's rubric (unweighted here), through verl's own reward manager
        assert set(score["reward_extra_info"]) == {
            "score",
            "acc",
            "pred",
            "format_ok",
            *rubric.KEYS,
            *FAILURE_KEYS,
        }
        assert score["reward_extra_info"]["rubric_by"] == "rules"
        if item["data_source"] == "medpanel_v2_opsd":
            assert max(model.images) >= 1 and max(model.image_pads) > 0  # tool images reached the model input
            assert len(out.multi_modal_data["images"]) >= 1
    # One episode per trajectory (verl's request_id), each holding one patient: read from the audit log.
    patients_by_episode: dict[str, set] = {}
    for line in server.state.settings.audit_log.read_text().splitlines()[audited:]:
        record = json.loads(line)
        patients_by_episode.setdefault(record["episode_id"], set()).add(record["patient_id"])
    assert len(patients_by_episode) == len(items)
    assert all(len(p) == 1 for p in patients_by_episode.values())
    assert sorted(p.pop() for p in patients_by_episode.values()) == sorted(
        i["extra_info"]["patient_id"] for i in items
    )


def test_a_slow_server_makes_the_adapter_time_out_retry_and_continue(dataset, tmp_path):
    schema = OpenAIFunctionToolSchema.model_validate(WITH_SLOW[0].tools["slow_tool"].openai_schema())
    with live_server(dataset, tmp_path, environments=WITH_SLOW) as live:
        tool = CaseTool(
            {
                "type": "native",
                "base_url": live.url,
                "timeout_s": 0.3,
                "retries": 2,
                "backoff_s": 0.05,
                "max_backoff_s": 0.1,
                "deadline_s": 10,
            },
            schema,
        )
        # slower than all three attempts together: the server answers identical calls in flight once, so a
        # retry of a call that takes 1 s would collect the first attempt's answer
        script = [call_text("slow_tool", {"seconds": 3.0}), "No evidence came back.\n<answer>A</answer>"]

        async def run():
            tokenizer = build_tokenizer()
            model = ScriptedModel(tokenizer, lambda text, images, turn: script[turn])
            loop = make_loop([tool], model)
            out = await loop.run(
                sampling_params={},
                raw_prompt=[{"role": "user", "content": "q"}],
                tools_kwargs={"slow_tool": {"create_kwargs": {"patient_id": "case0001"}}},
                extra_info={"index": 0},
            )
            return out, model

        out, model = asyncio.run(run())
        call = out.extra_fields["case_env_tool_calls"][0]
        assert call["status"] == "timeout" and call["infra_error"] and call["attempts"] == 3
        assert "did not answer (timeout)" in model.prompts[1]
        assert len(model.prompts) == 2  # the trajectory went on to its answer
        deadline = time.monotonic() + 15  # the server finishes the abandoned attempts in its own time
        while time.monotonic() < deadline:
            audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
            if len(audit) >= 3:
                break
            time.sleep(0.1)
        assert [a["tool"] for a in audit] == ["slow_tool"] * 3


def test_retries_ride_out_overload(dataset, tmp_path):
    schema = OpenAIFunctionToolSchema.model_validate(WITH_SLOW[0].tools["slow_tool"].openai_schema())
    with live_server(dataset, tmp_path, environments=WITH_SLOW, max_in_flight=1, max_queued=0) as live:
        tool = CaseTool(
            {
                "type": "native",
                "base_url": live.url,
                "timeout_s": 5,
                "retries": 8,
                "backoff_s": 0.05,
                "max_backoff_s": 1.0,
                "deadline_s": 30,
            },
            schema,
        )

        async def call(n: int):
            instance, _ = await tool.create(create_kwargs={"patient_id": "case0001"})
            response, _, metrics = await tool.execute(instance, {"seconds": 0.3})
            await tool.release(instance)
            return response, metrics

        async def run():
            return await asyncio.gather(*[call(n) for n in range(4)])

        results = asyncio.run(run())
    assert all(r.text == "slept 0.3 s" and m["status"] == "ok" for r, m in results)
    assert max(m["attempts"] for _, m in results) > 1  # some were refused with 429 first and retried


def test_launch_script_dry_run_composes_verls_config(bank):
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        [
            "bash",
            str(REPO / "scripts/train_grpo.sh"),
            "--dry-run",
            "--print-config",
            "--model",
            "Qwen/Qwen2.5-VL-7B-Instruct",
            "--data",
            str(bank),
            "--gpus",
            "8",
            "--format",
            "qwen3_coder",
            "trainer.total_training_steps=3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    # no GPU and no vLLM here: the checks that need them fail, so the dry run says so and exits 2
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert (
        lines[-1] == "dry run: config composed and validated by verl; a check failed, fix it before starting"
    )
    assert lines[-2].startswith("preflight: ") and lines[-2].endswith("failed")
    assert any(line.startswith("  FAIL       GPUs ") for line in lines)
    # the config (asked for with --print-config) first, then the main_ppo command, the table last
    config = yaml.safe_load(
        result.stdout[result.stdout.index("actor_rollout_ref:") : result.stdout.index("the run: ")]
    )
    assert result.stdout.index("the run: python -m verl.trainer.main_ppo") < result.stdout.index(
        "preflight: "
    )
    rollout = config["actor_rollout_ref"]["rollout"]
    assert config["algorithm"]["adv_estimator"] == "grpo"
    assert config["reward"]["custom_reward_function"]["name"] == "compute_score"
    assert (
        rollout["agent"]["default_agent_loop"] == "tool_agent"
        and config["trainer"]["total_training_steps"] == 3
    )
    # the model's tool-call format, and the bank's environment's tools; a dry run writes nothing into the bank
    assert rollout["multi_turn"]["format"] == "qwen3_coder"
    assert rollout["multi_turn"]["tool_config_path"].endswith("/verl_tools.yaml")
    assert not (bank / "verl_tools.yaml").exists()
    assert not Path(rollout["multi_turn"]["tool_config_path"]).exists()  # the dry run's copy is gone
    quiet = subprocess.run(
        ["bash", str(REPO / "scripts/train_grpo.sh"), "--dry-run", "--model", "m", "--data", str(bank)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert "actor_rollout_ref:" not in quiet.stdout and len(quiet.stdout.splitlines()) < 20
    missing = subprocess.run(
        [
            "bash",
            str(REPO / "scripts/train_grpo.sh"),
            "--dry-run",
            "--model",
            "m",
            "--data",
            str(bank / "nowhere"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert missing.returncode == 2 and f"bank {bank / 'nowhere'} does not exist" in missing.stderr


def test_scripted_rollouts_through_the_tool_agent_loop_earn_full_reward(bank, server):
    from case_env.verl.rollouts import run_rollouts

    summary = run_rollouts(bank / "train.parquet", server.url, per_source=3, concurrency=4)
    assert {source: s.n for source, s in summary.items()} == {
        "vista3d_opsd": 3,
        "medpanel_v2_opsd": 3,
        "medboard_opsd": 3,
    }
    for s in summary.values():
        assert s.reward == s.n and s.format_ok == s.n and s.infra_errors == 0 and s.tool_calls >= 2 * s.n


def test_eval_plays_a_row_as_verls_tool_agent_loop_does(bank, server, tmp_path, monkeypatch):
    """`case-env eval`'s loop and verl's ToolAgentLoop, the same scripted agent on the same rows: the same
    calls run, in the same order with the same arguments, and the reward and each of its components agree."""
    from case_env.core.calls import FIELD
    from case_env.core.trajectory import FILENAME, read
    from case_env.eval.runner import run_eval
    from case_env.verl.rollouts import load_rows, load_tools, play_rows

    monkeypatch.setenv("CASE_ENV_URL", server.url)
    parquet = bank / "test.parquet"
    items = load_rows(parquet, 2)
    played = asyncio.run(play_rows(items, load_tools("imaging"), 4))  # the environment's loop agent
    run_eval(parquet, server.url, "vision", tmp_path, concurrency=3, progress=False)
    evaluated = {r["question_id"]: r for r in read(tmp_path / FILENAME)}
    assert len(played) == 6 and len(evaluated) >= 6
    for row in played:
        record = evaluated[f"test-{row.item['extra_info']['question_idx']:05d}"]
        asked = [
            (call["function"]["name"], json.loads(call["function"]["arguments"]))
            for message in record["messages"]
            for call in message.get("tool_calls") or []
        ]
        ran = [(c["tool"], c["arguments"]) for c in row.output.extra_fields[FIELD]]
        assert asked == ran and len(ran) >= 2
        verl = row.score["reward_extra_info"]
        assert row.score["reward_score"] == record["score"]["score"]
        for key in ("acc", "pred", "format_ok", "rubric", *rubric.KEYS):
            assert verl[key] == record["score"][key], key
