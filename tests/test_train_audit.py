"""What an outside audit found reading the GPU path against verl 0.9.1's source (issue 43, part B), each
finding reproduced with the launcher's own composition and verl's real classes on CPU: every test here failed
on the code the audit read and passes now."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from case_env.core import registry
from case_env.core.bank import write
from case_env.envs.clinic.bank import build as build_clinic
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.synth import make_cases
from case_env.envs.imaging.recipes import RECIPES
from case_env.verl import checks, grpo
from tests.chat_stub import ScriptedChat
from tests.server_harness import serve_app
from tests.test_clinic_loop import pneumonia  # noqa: F401 (a fixture)
from tests.verl_rows import build_bank


@pytest.fixture(scope="module")
def bank(dataset, tmp_path_factory):
    return build_bank(dataset, tmp_path_factory.mktemp("bank"))


@pytest.fixture(scope="module")
def clinic_bank(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clinic-bank")
    write(build_clinic(make_cases(30, 0), 0, (0.8, 0.1, 0.1), NoiseConfig()), folder, {"env": "clinic"})
    return folder


def dry(*argv: str) -> dict[str, checks.Check]:
    run = grpo.prepare(list(argv))
    return {c.name: c for c in run.check(live=False)}


def test_b1_medexagents_loop_with_a_vision_model_passes_its_own_chat_template_check(clinic_bank, qwen2_5_vl):
    """The check fed a clinic tool an image, which MedExAgent's loop never shows and clinic tools never make."""
    found = dry("--model", str(qwen2_5_vl), "--data", str(clinic_bank), "--recipe", "medexagent")
    template = found["chat template"]
    assert template.status == checks.PASS, template.detail
    assert "image" not in template.detail  # no image is promised where none can come


def test_b2_a_bank_smaller_than_one_batch_is_refused(bank):
    rows = len(__import__("pyarrow.parquet").parquet.read_table(bank / "train.parquet"))
    too_small = dry("--model", "m", "--data", str(bank), "--batch-size", str(rows + 1))
    assert too_small["batches"].status == checks.FAIL
    assert f"{rows} training rows make no full batch of {rows + 1}" in too_small["batches"].detail
    assert too_small["batches"].fix.startswith(f"--batch-size {rows} or fewer")
    # the checkpoint estimate counts steps as verl's loader does (drop_last), not with a ceiling
    fits = dry("--model", "m", "--data", str(bank), "--batch-size", str(rows // 2 + 1))
    assert f"~{3} steps" in fits["checkpoints"].detail  # one full batch per epoch, 3 epochs


def test_b2_rows_the_length_filter_drops_count_against_the_batch(bank, qwen3):
    found = dry("--model", str(qwen3), "--data", str(bank), "--batch-size", "8", "data.max_prompt_length=700")
    assert found["prompt lengths"].status == checks.FAIL
    kept = found["batches"]
    assert "fitting data.max_prompt_length" in kept.detail
    assert kept.status == (
        checks.FAIL if " 0 steps" in kept.detail or "no full batch" in kept.detail else checks.PASS
    )


def test_b3_opsd_that_would_pad_the_batch_is_refused_with_sizes_that_divide(bank):
    found = dry("--model", "m", "--data", str(bank), "--recipe", "case", "--gpus", "8", "--teacher-gpus", "2")
    batches = found["batches"]
    # 64 prompts x 8 samples on 6 student GPUs: lcm(6, 128) = 384, so 512 became 768 with 256 dummies
    assert batches.status == checks.FAIL
    assert "512 sequences are padded to 768 (256 dummies)" in batches.detail
    assert "6 updates of about 85 real sequences instead of 4" in batches.detail
    size = int(batches.fix.split("--batch-size ")[1].split(",")[0])
    fixed = dry(
        "--model",
        "m",
        "--data",
        str(bank),
        "--recipe",
        "case",
        "--gpus",
        "8",
        "--teacher-gpus",
        "2",
        "--batch-size",
        str(size),
    )
    assert fixed["batches"].status == checks.PASS and "updates of" in fixed["batches"].detail
    plain = dry("--model", "m", "--data", str(bank), "--batch-size", "8")["batches"]
    assert (
        plain.status == checks.PASS and "each step 64 sequences in 4 updates of 16 on 8 GPUs" in plain.detail
    )


def test_b4_a_judged_recipe_without_a_judge_is_refused_or_said_rule_graded(bank, monkeypatch):
    monkeypatch.delenv("CASE_ENV_JUDGE_URL", raising=False)
    found = dry("--model", "m", "--data", str(bank), "--recipe", "case", "--batch-size", "48")
    assert found["judge"].status == checks.FAIL and "CASE_ENV_JUDGE_URL is unset" in found["judge"].detail
    assert "CASE_ENV_IMAGING_RUBRIC_GRADER=rules" in found["judge"].fix
    monkeypatch.setenv("CASE_ENV_IMAGING_RUBRIC_GRADER", "rules")
    ruled = dry("--model", "m", "--data", str(bank), "--recipe", "case", "--batch-size", "48")
    assert ruled["judge"].status == checks.PASS and "asks no judge" in ruled["judge"].detail
    monkeypatch.delenv("CASE_ENV_IMAGING_RUBRIC_GRADER")
    # a judge set and answering: the live check asks it once
    with serve_app(ScriptedChat(lambda messages: "ready").app) as stand_in:
        url = f"{stand_in.url}/v1"
        monkeypatch.setenv("CASE_ENV_JUDGE_URL", url)
        from case_env.core import llm

        llm.default_judge.cache_clear()
        run = grpo.prepare(["--model", "m", "--data", str(bank), "--recipe", "case", "--batch-size", "48"])
        weights = RECIPES["case"].reward_weights  # the rubric weighted
        found = checks.judge(registry.get(run.envs[0]), run.plan.env_vars, False, weights=weights)
        assert found.status == checks.SKIPPED
        live = checks.judge(registry.get(run.envs[0]), run.plan.env_vars, True, weights=weights)
        llm.default_judge.cache_clear()
    assert live.status == checks.PASS and url in live.detail


def test_b5_the_recipes_engine_follows_the_installed_one(bank, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "vllm" else (None if name == "sglang" else real(name, *a)),
    )
    config = grpo.prepare(["--model", "m", "--data", str(bank), "--recipe", "medexagent"]).config
    assert config.actor_rollout_ref.rollout.name == "vllm"  # make train-env's default engine
    chosen = grpo.prepare(
        ["--model", "m", "--data", str(bank), "--recipe", "medexagent", "--rollout", "sglang"]
    )
    assert chosen.config.actor_rollout_ref.rollout.name == "sglang"


def test_b6_the_clinic_length_filter_measures_what_medexagents_loop_renders(clinic_bank, qwen3):
    """MedExAgent's loop renders no tool block, so its rows are measured without one: the longest prompt the
    check reports is the longest prompt rendered with no tools, far below its rendering with the row's tools."""
    import json
    import re

    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    found = dry("--model", str(qwen3), "--data", str(clinic_bank), "--recipe", "medexagent")
    lengths = found["prompt lengths"]
    assert lengths.status == checks.PASS, lengths.detail
    reported = int(re.search(r"longest ([\d,]+)", lengths.detail).group(1).replace(",", ""))
    tokenizer = AutoTokenizer.from_pretrained(qwen3)
    schemas = grpo.prepare(
        ["--model", str(qwen3), "--data", str(clinic_bank), "--recipe", "medexagent"]
    ).schemas

    def tokens(prompt: list, **tools) -> int:
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=False, **tools)
        return len(ids)

    plain, with_tools = 0, 0
    for split in ("train", "val"):
        for row in pq.read_table(clinic_bank / f"{split}.parquet").to_pylist():
            prompt = list(row["prompt"])
            plain = max(plain, tokens(prompt))
            offered = checks.offered_tools({**row, "extra_info": json.loads(row["extra_info"])}, schemas)
            with_tools = max(with_tools, tokens(prompt, tools=offered))
    assert reported == plain < with_tools


def test_b7_patient_replies_are_whole_as_medexagent_keeps_them_or_cut_as_verl_cuts_tool_text(
    pneumonia,  # noqa: F811
    checkpoint,
    monkeypatch,
):
    from tests.test_clinic_loop import TURNS, _tokenizer, composed, one_batch, rollout

    bank, server = pneumonia
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    config = composed(bank, checkpoint)
    config.actor_rollout_ref.rollout.multi_turn.max_tool_response_length = 24

    def heard(config) -> tuple[str, str]:
        model, played, *_ = asyncio.run(rollout(config, one_batch(config, _tokenizer(checkpoint)), TURNS))
        said = played.extra_fields["case_env_tool_calls"][0]["text"]  # the whole reply, as the server gave it
        prompt = model.prompts[1]  # the second turn sees the patient's first reply
        return said, prompt.split(TURNS[0], 1)[1].split("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]

    said, reply = heard(config)
    assert len(said) > 24 and reply == said  # MedExAgent's default: the reply whole
    loops = Path(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    loops.write_text(loops.read_text().replace("MedExAgentLoop\n", "MedExAgentLoop\n  cut_replies: true\n"))
    said, reply = heard(config)
    assert reply == said[:12] + "...(truncated)..." + said[-12:]


def test_b8_a_dry_run_with_several_nodes_and_a_loopback_server_says_it_cannot_work(bank):
    found = dry("--model", "m", "--data", str(bank), "--nodes", "2", "--server-url", "http://127.0.0.1:8000")
    nodes = found["server from every node"]
    assert nodes.status == checks.FAIL and "reaches only the machine calling it" in nodes.detail
    one = dry("--model", "m", "--data", str(bank))["server from every node"]
    assert one.status == checks.SKIPPED


def test_b9_a_dry_run_writes_nothing_beside_the_bank(clinic_bank):
    """The clinic's agent loops went to `<bank>/verl_agent_loops.yaml` though a dry run writes nothing."""
    before = sorted(p.name for p in clinic_bank.iterdir())
    run = grpo.prepare(["--model", "m", "--data", str(clinic_bank), "--recipe", "medexagent", "--dry-run"])
    loops = run.config.actor_rollout_ref.rollout.agent.agent_loop_config_path
    assert sorted(p.name for p in clinic_bank.iterdir()) == before
    assert "medexagent" in Path(loops).read_text() and str(clinic_bank) not in loops
