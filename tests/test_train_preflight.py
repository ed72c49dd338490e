"""Issue 30: the defects a first GPU run would meet, each shown and fixed on CPU with verl 0.9.1's own classes,
Qwen's real vocabulary (`tests/qwen_models.py`) and templates built here; no download.

The multi-node rehearsal is in `test_train_cluster.py`."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import httpx
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from verl.tools.tool_registry import load_all_tools
from verl.utils.dataset.rl_dataset import RLHFDataset

from case_env.core.answers import final_segment
from case_env.core.bank import write
from case_env.core.calls import FIELD
from case_env.envs.clinic.bank import build as build_clinic
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.synth import make_cases
from case_env.lm.chat_templates import FAMILIES, family_for, template
from case_env.reward import score_row
from case_env.server.control import Sizing
from case_env.verl import checks, grpo, model_files
from case_env.verl.config import path_for
from case_env.verl.dataset import CaseRLHFDataset
from case_env.verl.offline import (
    ScriptedModel,
    build_processor,
    build_tokenizer,
    loop_config,
    make_loop,
    run_row,
)
from case_env.verl.rehearsal import FINAL, TOOL_OUTPUT, rehearse
from case_env.verl.tool import EPISODE_FIELD
from tests.server_harness import live_server
from tests.verl_rows import REPO, build_bank, rows, script_for


@pytest.fixture(scope="module")
def bank(dataset, tmp_path_factory):
    return build_bank(dataset, tmp_path_factory.mktemp("bank"))


def prepare(*argv: str):
    return grpo.prepare(list(argv))


def table(out: str) -> dict[str, tuple[str, str]]:
    """The preflight table in `out`: check name -> (status, the rest of the line)."""
    rows_ = {}
    for line in out[out.index("preflight: ") :].splitlines()[1:]:
        if not line.startswith("  "):
            break
        status, rest = line.strip().split(None, 1)
        name = next(c for c in CHECKS if rest.startswith(c))
        rows_[name] = (status, rest[len(name) :].strip())
    return rows_


CHECKS = (
    "chat template",
    "prompt lengths",
    "served tools",
    "server from every node",
    "tool images",
    "batches",
    "checkpoints",
    "logged per step",
    "rollout engine",
    "GPUs",
    "episode ids",
    "distillation",
    "judge",
)


def test_the_tests_tokenizer_counts_as_qwen_does(qwen3):
    """Qwen's own ids (docs/sources.md, Qwen vocabulary): prompt lengths here are a Qwen model's."""
    tokenizer = model_files.load(qwen3).tokenizer
    assert tokenizer.encode("Hello, world") == [9707, 11, 1879]
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>", "<think>"]
    assert tokenizer.convert_tokens_to_ids(special) == [151643, 151644, 151645, 151657, 151665, 151667]


def test_the_models_files_are_found_in_the_hugging_face_cache_and_never_downloaded(
    bank, qwen2_5_vl, tmp_path, monkeypatch
):
    import shutil

    import huggingface_hub.constants

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-VL-7B-Instruct" / "snapshots" / ("0" * 40)
    shutil.copytree(qwen2_5_vl, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = prepare("--model", "Qwen/Qwen2.5-VL-7B-Instruct", "--data", str(bank))
    assert run.files is not None and run.files.path == snapshot and run.files.processor is not None
    assert run.plan.chat_template == template(FAMILIES["qwen2_5_vl"])
    assert model_files.local_model_dir("Qwen/Qwen3-8B") is None  # not in the cache: unverified, no download


# 1. Qwen2.5-VL's processor template renders no tools


def test_qwen2_5_vls_own_template_hides_the_tools_and_the_reward_reads_tool_output(bank, qwen2_5_vl):
    """The defect, seen through verl's ToolAgentLoop with the model's files as verl loads them."""
    run = prepare("--model", str(qwen2_5_vl), "--data", str(bank), "--chat-template", "model")
    assert run.plan.chat_template is None and run.config.actor_rollout_ref.model.custom_chat_template is None
    item = run.rows["medpanel_v2_opsd"]
    offered = checks.offered_tools(item, run.schemas)
    episode = rehearse(run.files, run.config, item, run.schemas, offered)
    # no schema of any offered tool (the persona's prompt names some tools in prose)
    assert "<tools>" not in episode.prompt
    assert not any(f'"name": "{s["function"]["name"]}"' in episode.prompt for s in offered)
    assert "<tool_response>" not in episode.response
    # with no markers to split on, the tool's own text is what the reward takes for the model's answer
    assert TOOL_OUTPUT in final_segment(episode.response)
    problems = checks.template_problems(run.files, run.config, item, run.schemas, offered)
    assert any("renders no tool schemas" in p for p in problems)
    assert any("without <tool_response>" in p for p in problems)


def test_the_launcher_gives_qwen2_5_vl_case_envs_template_and_the_reward_reads_the_answer(bank, qwen2_5_vl):
    run = prepare("--model", str(qwen2_5_vl), "--data", str(bank))  # --chat-template auto
    shipped = template(FAMILIES["qwen2_5_vl"])
    assert run.plan.chat_template == shipped
    assert run.config.actor_rollout_ref.model.custom_chat_template == shipped  # what verl's workers apply
    assert "chosen because the model's processor template renders no tool schemas" in run.plan.template_origin
    for source, item in run.rows.items():
        offered = checks.offered_tools(item, run.schemas)
        episode = rehearse(run.files, run.config, item, run.schemas, offered)
        assert all(f'"name": "{s["function"]["name"]}"' in episode.prompt for s in offered), source
        assert episode.executed == [episode.tool]  # verl's hermes parser read the call the template taught
        # a row offering a drawing tool has one called, and its image reached the model as vision tokens
        assert episode.image_sent == (source != "medboard_opsd")
        assert (episode.image_pads > 0) == episode.image_sent
        tail = final_segment(episode.response)
        assert TOOL_OUTPUT not in tail and tail.strip().endswith(FINAL)
        score = score_row(item["data_source"], episode.response, "B", item["extra_info"])
        assert (score["pred"], score["acc"]) == ("B", 1.0)


def test_without_the_models_files_a_family_known_to_lack_tools_still_gets_the_template(bank):
    run = prepare("--model", "Qwen/Qwen2.5-VL-7B-Instruct", "--data", str(bank))
    assert run.files is None and run.plan.chat_template == template(FAMILIES["qwen2_5_vl"])
    # Qwen3 publishes a tool-capable template: unverified, the launcher leaves the model's own in place
    assert prepare("--model", "Qwen/Qwen3-8B", "--data", str(bank)).plan.chat_template is None
    assert family_for(None, "Qwen/Qwen3-Coder-30B-A3B-Instruct") is None
    assert family_for("qwen3_vl_moe").name == "qwen3_vl" and family_for(None, "Qwen/Qwen2-VL-7B").vision


def test_the_shipped_templates_render_qwens_tool_block_and_thinking(qwen3):
    """The tool block, call form and tool-response turns of Qwen2.5/Qwen3's published instruct templates
    (docs/sources.md, Chat templates), and Qwen3's reasoning kept only after the last real user query."""
    files = model_files.load(qwen3)
    tools = [
        {"type": "function", "function": {"name": "list_visits", "description": "Visits.", "parameters": {}}}
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How many visits?"},
        {
            "role": "assistant",
            "content": "<think>\nlook first\n</think>\n\n",
            "tool_calls": [{"type": "function", "function": {"name": "list_visits", "arguments": {}}}],
        },
        {"role": "tool", "content": "two visits"},
        {"role": "assistant", "content": "<think>\ncounted\n</think>\n\n<answer>2</answer>"},
    ]
    text = files.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    assert text.startswith(
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    )
    assert (
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call><|im_end|>\n" in text
    )
    assert (
        '<|im_start|>assistant\n<think>\nlook first\n</think>\n\n<tool_call>\n{"name": "list_visits", '
        '"arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\ntwo visits\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\ncounted\n</think>\n\n<answer>2</answer><|im_end|>\n"
    ) in text
    earlier = files.tokenizer.apply_chat_template(
        [*messages, {"role": "user", "content": "And the organs?"}], tools=tools, tokenize=False
    )
    assert "look first" not in earlier and "counted" not in earlier  # reasoning of earlier queries dropped
    assert earlier.endswith("<|im_start|>user\nAnd the organs?<|im_end|>\n")


# 2. Prompt lengths: verl measures every row with every tool of the YAML


def test_clinic_rows_fit_medexagents_4096_tokens_measured_as_their_loop_renders_them(tmp_path, qwen3):
    """verl's filter renders every prompt with all 69 clinic tools; a row is measured as its loop renders it:
    under MedExAgent's loop with no tool block (its exam list is in the system prompt), under verl's
    tool_agent with the row's tool_selection."""
    cases = make_cases(14, 0)  # verl's own filter renders 69 tools per row: a few rows say it
    write(build_clinic(cases, 0, (0.8, 0.1, 0.1), NoiseConfig()), tmp_path / "loop", {"env": "clinic"})
    write(
        build_clinic(cases, 0, (0.8, 0.1, 0.1), NoiseConfig(), patient="ask_patient"),
        tmp_path / "tools",
        {"env": "clinic"},
    )
    files = model_files.load(qwen3)
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 4096,
            "filter_overlong_prompts": True,
            "tool_config_path": str(REPO / path_for("clinic")),
        }
    )
    for bank in ("loop", "tools"):
        parquet = [str(tmp_path / bank / "train.parquet")]
        total = pq.read_metadata(parquet[0]).num_rows
        ours = CaseRLHFDataset(data_files=parquet, tokenizer=files.tokenizer, config=config)
        assert total >= 8 and len(ours) == total  # every row kept
        longest = max(ours.prompt_tokens(row) for row in ours.raw_rows())
        assert 800 < longest <= 4096
        if bank == "tools":  # verl's own filter renders each prompt with all 69 clinic tools and drops every
            # row (once: hashing its tokenizer for the datasets library's fingerprint takes 20 s here)
            stock = RLHFDataset(data_files=parquet, tokenizer=files.tokenizer, config=config)
            assert len(stock) == 0
        row = ours.raw_rows()[0]
        plain = files.tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
        if bank == "loop":  # MedExAgent's loop: no tool block, the prompt alone
            assert ours.offered_tools(row) is None and ours.prompt_tokens(row) == len(plain["input_ids"])
        else:
            offered = [s["function"]["name"] for s in ours.offered_tools(row)]
            assert offered == [n for n in ours[0]["extra_info"]["tool_selection"]] and len(offered) < 69
            assert ours.prompt_tokens(row) > len(plain["input_ids"])


def test_preflight_counts_rows_over_the_limit_per_source_and_names_the_length_that_fits(
    bank, qwen2_5_vl, capsys
):
    assert (
        grpo.main(
            ["--dry-run", "--model", str(qwen2_5_vl), "--data", str(bank), "data.max_prompt_length=600"]
        )
        == 2  # a failed check: the dry run says so in its exit code
    )
    status, detail = table(capsys.readouterr().out)["prompt lengths"]
    assert status == "FAIL" and "verl would drop rows over data.max_prompt_length=600" in detail
    longest = max(int(x.replace(",", "")) for x in re.findall(r"longest ([\d,]+)", detail))
    fit = -(-longest // 256) * 256
    assert f"fix: data.max_prompt_length={fit} (fits the longest, {longest:,} tokens)" in detail


# 3. Checkpoints and validation


def test_every_recipe_saves_checkpoints_validates_and_resumes(bank, tmp_path):
    grpo = prepare("--model", "m", "--data", str(bank), "--checkpoint-dir", str(tmp_path / "ckpt")).config
    trainer = grpo.trainer
    assert (trainer.save_freq, trainer.test_freq, trainer.val_before_train) == (20, 10, True)
    assert (trainer.resume_mode, trainer.default_local_dir) == ("auto", str(tmp_path / "ckpt"))
    assert trainer.experiment_name == f"case-env-grpo-m-{bank.name}"
    medex = prepare("--model", "m", "--data", str(bank), "--recipe", "medexagent").config.trainer
    # MedExAgent's own: a checkpoint every 200 steps, no evaluation (train/rl/run.py, config/rl_config.yaml)
    assert (medex.save_freq, medex.test_freq, medex.val_before_train) == (200, -1, False)
    assert medex.default_local_dir.endswith(f"checkpoints/case-env/case-env-medexagent-m-{bank.name}")
    check = checks.checkpoints(grpo, 100, allowed_off=False)
    assert check.status == checks.PASS and "starts afresh (no checkpoint yet)" in check.detail


def test_a_run_that_would_save_nothing_is_refused_unless_asked_for(bank):
    off = prepare("--model", "m", "--data", str(bank), "trainer.save_freq=-1").config
    check = checks.checkpoints(off, 85, allowed_off=False)
    assert check.status == checks.FAIL and "would end with no weights" in check.detail
    assert "--no-checkpoints" in check.fix
    allowed = prepare("--model", "m", "--data", str(bank), "--no-checkpoints").config
    assert allowed.trainer.save_freq == -1
    assert checks.checkpoints(allowed, 85, allowed_off=True).status == checks.PASS


# 5. The GPU install path


def test_the_rollout_engine_check_names_the_install_path(bank):
    config = prepare("--model", "m", "--data", str(bank), "--recipe", "medexagent").config
    check = checks.rollout_engine(config)
    assert check.status == checks.FAIL and check.detail.startswith("sglang is not installed")
    assert check.fix.startswith("make train-env ENGINE=sglang")
    # verl 0.9.1's extras pin the engines and flash-attn; train-env installs exactly those
    pins = checks.verl_pins()
    assert (pins["vllm"], pins["sglang"], pins["flash-attn"]) == ("0.24.0", "0.5.12", "2.8.3")
    dry = subprocess.run(
        ["make", "-n", "train-env", "ENGINE=vllm", "ALLOW_NO_GPU=1"], cwd=REPO, capture_output=True, text=True
    )
    assert "pip install 'verl[vllm]==0.9.1'" in dry.stdout
    # flash-attn as verl's own uv setup takes it: prebuilt for its CUDA 13.0 torch pin, or built from source
    torch_minor = ".".join(pins["torch"].split(".")[:2])
    assert f"flash_attn-{pins['flash-attn']}+cu130torch{torch_minor}-$abi-$abi-linux_x86_64.whl" in dry.stdout
    assert f"--no-build-isolation 'flash-attn=={pins['flash-attn']}'" in dry.stdout


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (["ENGINE=trtllm"], "ENGINE=trtllm: choose one of vllm sglang"),
        (["ENGINE=vllm", "PATH=/usr/bin:/bin"], "no nvidia-smi here"),
    ],
)
def test_train_env_refuses_an_unknown_engine_and_a_machine_without_gpus(variables, message):
    result = subprocess.run(["make", "train-env", *variables], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr


# 6. Episode ids under full_determinism, server sizing, overrides verl does not read


def test_trajectories_under_full_determinism_keep_their_own_episodes(bank, dataset, tmp_path, monkeypatch):
    """verl names every request det-0 under full_determinism; the server binds an episode to its first
    patient, so without a per-trajectory id every trajectory after the first was refused with 403."""
    config = loop_config(max_turns=12)
    config.actor_rollout_ref.rollout.full_determinism = True
    by_patient = {item["extra_info"]["patient_id"]: item for item in rows(bank, per_source=6)}
    items = list(by_patient.values())[:3]
    assert len(items) == 3
    with live_server(dataset, tmp_path) as server:
        monkeypatch.setenv("CASE_ENV_URL", server.url)
        tools = load_all_tools(tool_config_path=str(REPO / path_for("imaging")), function_tool_path=None)

        async def one(item):
            script = script_for(item, correct=True)
            tokenizer = build_tokenizer()
            model = ScriptedModel(tokenizer, lambda text, images, turn: script[turn])
            return await run_row(make_loop(tools, model, build_processor(tokenizer), config), item)

        async def all_():
            return await asyncio.gather(*(one(item) for item in items))

        outputs = asyncio.run(all_())
        statuses = [c["status"] for out in outputs for c in out.extra_fields[FIELD]]
        assert len(statuses) >= 2 * len(items) and set(statuses) == {"ok"}
        episodes = [out.extra_fields[EPISODE_FIELD] for out in outputs]
        assert len(set(episodes)) == len(items) and all(e.startswith("det-0-") for e in episodes)
        # what verl's shared id met before: the server keeps an episode to its first patient
        patients = [item["extra_info"]["patient_id"] for item in items[:2]]
        answers = [
            httpx.post(
                f"{server.url}/v1/tools/list_visits",
                json={"episode_id": "det-0", "patient_id": p, "arguments": {}},
            ).status_code
            for p in patients
        ]
        assert answers == [200, 403]
    assert (
        checks.episode_ids(OmegaConf.create({"actor_rollout_ref": config.actor_rollout_ref})).status == "pass"
    )


def test_a_started_server_is_sized_to_the_steps_trajectories():
    # MedExAgent's step: 64 prompts x 16 samples, one call in flight each
    assert Sizing.for_concurrency(1024, cores=64) == Sizing(2, 1024)
    assert Sizing.for_concurrency(4096, cores=64) == Sizing(8, 1024)
    assert Sizing.for_concurrency(4096, cores=8) == Sizing(2, 4096)  # few cores: fewer workers, longer queues
    sizing = Sizing.for_concurrency(2048, cores=16)
    assert sizing.workers * (256 + sizing.max_queued) >= 2 * 2048  # twice a fair share per worker


def test_overrides_verl_does_not_read_are_gone_and_the_format_help_names_the_right_models(bank):
    run = prepare("--model", "m", "--data", str(bank))
    keys = {item.split("=", 1)[0] for item in run.plan.overrides()}
    for unread in (
        "actor_rollout_ref.rollout.mode",
        "data.return_raw_chat",
        "data.return_multi_modal_inputs",
        "data.truncation",
    ):
        assert unread not in keys
    help_text = subprocess.run(
        [sys.executable, "-m", "case_env.verl.grpo", "--help"], capture_output=True, text=True
    ).stdout
    assert "qwen3_coder, XML inside <tool_call> (Qwen3-Coder, Qwen3.5)" in " ".join(help_text.split())


def test_a_server_already_there_that_refuses_the_token_is_named_not_used(dataset, tmp_path, monkeypatch):
    """`make demo` once met another run's server on its port, with a token: every call an infra error."""
    from case_env.server.control import ensure_server

    with live_server(dataset, tmp_path, token="another-runs-token-0123") as other:
        monkeypatch.delenv("CASE_ENV_TOKEN", raising=False)
        with pytest.raises(SystemExit, match="refuses calls without a token \\(401\\): set CASE_ENV_TOKEN"):
            ensure_server(other.url, dataset)
        with pytest.raises(SystemExit, match="refuses this token"):
            ensure_server(other.url, dataset, env={"CASE_ENV_TOKEN": "wrong-token-0123456"})
        assert ensure_server(other.url, dataset, env={"CASE_ENV_TOKEN": "another-runs-token-0123"}) is None
