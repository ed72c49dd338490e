"""CASE's two stages on TRL with a real model on CPU: the SFT of the `tuned` fixture (conftest), then two GRPO
steps with TRL's `environment_factory` against a live case-env server. Every reward is case-env's reward of
what the model wrote with the calls that ran, every call reached the server's episode log, the weights moved,
and the checkpoint loads and generates."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from case_env.reward import score_row
from case_env.trl.train import GRPORun, run_grpo
from tests.model_world import in_own_process


@pytest.fixture(scope="module")
def trained(world, tuned, tmp_path_factory, monkeypatch_module):
    # the rubric weighted, graded by its rules: rewards between 0 and 1.5 rarely tie within a group
    monkeypatch_module.setenv("CASE_ENV_IMAGING_RUBRIC_GRADER", "rules")
    out = tmp_path_factory.mktemp("grpo")
    run = GRPORun(
        str(tuned),
        world.banks["imaging"] / "train.parquet",
        out,
        world.url,
        steps=2,
        prompts_per_step=1,
        generations=4,  # a group of four: the rewards of a small model's samples rarely all tie
        max_completion_length=256,  # room for two calls and their answers: the test needs the calls, not the reply
        max_tool_calls=2,
        temperature=0.7,
        learning_rate=5e-5,
        limit=6,
        save_steps=2,  # one checkpoint, the last step's: each holds the optimizer's state
        seed=1,
        # the cheaper step (docs/models.md): only the top layers learn, so the backward pass stops there and
        # needs no recomputed activations
        train_layers=6,
        gradient_checkpointing=False,
        reward_weights={"rubric": 0.5},
    )
    return in_own_process(run_grpo, run), out


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_sft_stage_learned_from_the_trajectories(tuned):
    log = [json.loads(line) for line in (tuned.parent / "log.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in log if "loss" in e]
    assert len(losses) >= 4 and losses[-1] < losses[0]
    assert (tuned.parent / "curve.png").stat().st_size > 1000


def test_two_grpo_steps_reward_with_case_envs_reward_and_move_the_weights(trained, tuned, world):
    final, out = trained
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 4 and {r["step"] for r in rollouts} == {0, 1}
    calls = 0
    for r in rollouts:
        # the reward is case-env's for the row: recomputed from the text and the calls as they ran
        assert r["extra_info"]["reward_weights"] == {"rubric": 0.5}  # the run's weight reached every row
        extra = {**r["extra_info"], "case_env_tool_calls": r["calls"]}
        again = score_row(r["data_source"], r["text"], r["ground_truth"], extra)
        assert again["score"] == pytest.approx(r["reward"]["score"]) and again["pred"] == r["reward"]["pred"]
        # every call the environment made is in the server's log of that episode, in order
        logged = world.episodes(r["episode_id"])
        assert [(c["tool"], c["arguments"], c["status"]) for c in logged] == [
            (c["tool"], c["arguments"], c["status"]) for c in r["calls"]
        ]
        calls += len(r["calls"])
    assert calls >= 2  # the tuned model gathers evidence
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()][1:]
    steps = [e for e in log if "reward" in e]
    assert len(steps) == 2
    for entry in steps:
        mine = [r["reward"]["score"] for r in rollouts if r["step"] == entry["step"] - 1]
        assert entry["reward"] == pytest.approx(sum(mine) / len(mine), abs=1e-4)
    # rewards differed within some group, so the policy gradient moved the weights
    assert any(e["reward_std"] > 0 for e in steps)
    before, after = load_file(tuned / "model.safetensors"), load_file(final / "model.safetensors")
    moved = sum(not torch.equal(before[k], after[k]) for k in before)
    assert moved > 0
    # the checkpoint loads and generates
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    out_ids = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out_ids.shape[1] > ids["input_ids"].shape[1]


def test_grpo_refuses_reward_weights_its_rows_reward_lacks_before_a_model_loads(world, tmp_path):
    from tests.test_cli import run

    bank = str(world.banks["imaging"] / "train.parquet")
    done = run(
        *("train", "trl", "grpo", "--model", "no-such-model", "--bank", bank, "--out", str(tmp_path / "run")),
        *("--server-url", world.url, "--reward-weights", "rubrik=1"),
    )
    assert done.returncode == 2, done.stderr
    assert (
        "error: --reward-weights: the imaging reward has no component 'rubrik'; choose among acc, rubric"
        in (done.stderr)
    )


def test_every_grpo_option_is_the_runs_field_of_its_name():
    """`train trl grpo` hands its options to the run by name: an option whose name no field has would be
    dropped, a field no option names would fail at run time. The two sets must be equal."""
    import dataclasses
    import inspect

    from case_env.trl import commands

    options = set(inspect.signature(commands.grpo).parameters)
    assert options == {f.name for f in dataclasses.fields(GRPORun)}


def test_grpo_options_reach_the_run_by_name(world, tmp_path, monkeypatch):
    """Every option of `train trl grpo` lands in the run's field of its name (they once went by position, and
    --resume, --train-layers and --gradient-checkpointing swapped places)."""
    from typer.testing import CliRunner

    import case_env.cli
    from case_env.trl import commands, train

    seen = []
    monkeypatch.setattr(train, "run_grpo", lambda run: seen.append(run) or tmp_path / "final")
    monkeypatch.setattr(commands, "model_dir", lambda model: model)
    bank = str(world.banks["imaging"] / "train.parquet")
    result = CliRunner().invoke(
        case_env.cli.app,
        [
            *("train", "trl", "grpo", "--model", "m", "--bank", bank, "--out", str(tmp_path / "run")),
            *(
                "--server-url",
                world.url,
                "--steps",
                "7",
                "--train-layers",
                "6",
                "--no-gradient-checkpointing",
            ),
            *("--lora-rank", "8", "--max-completion", "300", "--reward-weights", "rubric=0.5"),
        ],
    )
    assert result.exit_code == 0, result.output
    run = seen[0]
    assert (run.steps, run.train_layers, run.gradient_checkpointing, run.resume, run.lora_rank) == (
        *(7, 6, False, False, 8),
    )
    assert run.max_completion_length == 300 and run.reward_weights == {"rubric": 0.5}
