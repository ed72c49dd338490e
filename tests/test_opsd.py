"""OPSD (case_env/verl/distill.py) through verl 0.9.1's real AgentLoopWorker on CPU, composed by the launcher's
`--recipe case`, against a live server and a scripted teacher server: the teacher is sent the privileged prompt
followed by the student's own response; what comes back lines up, through verl's own padding and slicing,
with the student's response tokens; tool-response tokens are masked as verl masks them without OPSD; rows
without an insight, and validation rollouts, fall back to verl's own behaviour."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json

import pytest
import torch
from verl.workers.rollout.replica import TokenOutput

from case_env.verl.dataset import offered_tools
from case_env.verl.distill import (
    HEADING,
    PrivilegedAgentLoops,
    PrivilegedAgentLoopWorker,
    PrivilegedAgentLoopWorkerTQ,
    privileged_messages,
)
from case_env.verl.offline import ScriptedModel
from tests.server_harness import live_server
from tests.test_clinic_loop import pneumonia  # noqa: F401 (a fixture)
from tests.verl_rows import build_bank, script_for


def teacher_logprob(token: int) -> float:
    """What the scripted teacher gives token `token` wherever it stands: its identity, so a position that
    scores the wrong token shows."""
    return -(token + 1) / 1e6


class ScriptedTeacher:
    """Stands in for verl's teacher server: vLLM's prompt log-probs as verl reads them
    (`extract_prompt_logprobs`): position i scores token i + 1, a dummy 0 at the last position."""

    def __init__(self):
        self.sent: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
        assert sampling_params["max_tokens"] == 1 and sampling_params["prompt_logprobs"] == 0
        sequence = list(prompt_ids)
        self.sent.append(sequence)
        ids = [[t] for t in sequence[1:]] + [[0]]
        logprobs = [[teacher_logprob(t)] for t in sequence[1:]] + [[0.0]]
        return TokenOutput(token_ids=[0], extra_fields={"prompt_ids": ids, "prompt_logprobs": logprobs})


@pytest.fixture(scope="module")
def bank(dataset, tmp_path_factory):
    return build_bank(dataset, tmp_path_factory.mktemp("opsd-bank"))


@pytest.fixture(scope="module")
def server(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("opsd-server")) as live:
        yield live


def composed(bank, model_dir, *argv: str):
    from case_env.verl import launch, options

    args, extra = options.parse(["--model", str(model_dir), "--data", str(bank), *argv])
    args.tool_config = launch.bank_tool_config(bank)
    plan = launch.Plan(args, extra, env_vars=launch.forwarded_env(args, "http://127.0.0.1:8000"))
    config = launch.compose(plan.overrides())
    launch.validate(config)
    return config


TEXT_SOURCES = ("vista3d_opsd", "medboard_opsd")  # the text model reads no images: no radiologist rows


def batch_of(config, tokenizer, per_source: int = 2, blank: int | None = None):
    """The first rows of the anatomist's and consultant's sources, as verl's dataset yields them; row `blank`
    without its insight."""
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    from case_env.verl.dataset import CaseRLHFDataset

    data = CaseRLHFDataset(
        data_files=[config.data.train_files],
        tokenizer=tokenizer,
        config=OmegaConf.create(OmegaConf.to_yaml(config.data)),
        processor=None,
    )
    chosen, seen = [], {}
    for i in range(len(data)):
        item = data[i]
        if item["data_source"] in TEXT_SOURCES and seen.get(item["data_source"], 0) < per_source:
            seen[item["data_source"]] = seen.get(item["data_source"], 0) + 1
            chosen.append(item)
    if blank is not None:
        chosen[blank]["extra_info"] = {**chosen[blank]["extra_info"], "teacher_insight": ""}
    return DataProto.from_single_dict(collate_fn(chosen)), chosen


def batch_policy(items):
    """One scripted model's policy for a batch: each row, found by its question, counts its own turns and plays
    its script (the evidence's calls, then the right answer)."""
    scripts = {item["extra_info"]["question"]: script_for(item, correct=True) for item in items}
    turns: dict[str, int] = {}

    def policy(text, _images, _turn):
        key = next(k for k in scripts if k in text)
        turns[key] = turns.get(key, 0) + 1
        return scripts[key][min(turns[key] - 1, len(scripts[key]) - 1)]

    return policy


async def rollout(worker_class, config, batch, items, teacher=None, validate=False):
    """The batch through the worker, each row played by its scripted policy (the evidence's calls, then
    the right answer)."""
    with contextlib.redirect_stdout(io.StringIO()):  # verl prints every tool schema it loads
        worker = worker_class(
            config, llm_client=None, teacher_client={"default": teacher} if teacher else None
        )
    worker.llm_client = ScriptedModel(worker.tokenizer, batch_policy(items))
    batch.meta_info["validate"] = validate
    return worker, await worker.generate_sequences(batch)


def response_view(out, name):
    """`name` sliced to the response positions exactly as verl's trainer does before its loss
    (left_right_2_no_padding, then no_padding_2_padding)."""
    from tensordict import TensorDict
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    keys = ("input_ids", "attention_mask", "response_mask", "position_ids", "prompts", "responses")
    data = TensorDict({k: out.batch[k] for k in keys}, batch_size=out.batch["input_ids"].shape[0])
    data["teacher_logprobs"], data["teacher_ids"] = out.batch["teacher_logprobs"], out.batch["teacher_ids"]
    data = left_right_2_no_padding(data)
    return no_padding_2_padding(data[name], data).squeeze(-1)


@pytest.fixture(scope="module")
def played(bank, server, checkpoint):
    from transformers import AutoTokenizer

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CASE_ENV_URL", server.url)
        config = composed(bank, checkpoint, "--recipe", "case", "--gpus", "8")
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        batch, items = batch_of(config, tokenizer, blank=2)
        teacher = ScriptedTeacher()
        worker, out = asyncio.run(rollout(PrivilegedAgentLoopWorker, config, batch, items, teacher))
        yield config, tokenizer, items, teacher, worker, out


def _lengths(out, i):
    prompt_width = out.batch["prompts"].shape[1]
    prompt = int(out.batch["attention_mask"][i, :prompt_width].sum())
    response = int(out.batch["attention_mask"][i, prompt_width:].sum())
    return prompt_width, prompt, response


def test_the_recipe_composes_verls_distillation_with_the_privileged_manager(played):
    config = played[0]
    assert config.distillation.enabled is True
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class.endswith("PrivilegedAgentLoops")
    teacher = config.distillation.teacher_models.teacher_model
    assert teacher.model_path == config.actor_rollout_ref.model.path  # self-distillation
    assert teacher.inference.prompt_length == config.data.max_prompt_length + 1024
    assert config.trainer.n_gpus_per_node + config.distillation.n_gpus_per_node == 8
    assert config.distillation.distillation_loss.use_task_rewards is True  # GRPO's loss stays


def test_the_teacher_is_sent_the_privileged_prompt_then_the_students_response(played):
    _config, tokenizer, items, teacher, worker, out = played
    assert len(teacher.sent) == len(items) == 4
    by_prompt = {}
    for i, item in enumerate(items):
        width, prompt, response = _lengths(out, i)
        prompt_ids = out.batch["prompts"][i, width - prompt :].tolist()
        response_ids = out.batch["responses"][i, :response].tolist()
        sent = next(s for s in teacher.sent if s[len(s) - response :] == response_ids)
        insight = item["extra_info"]["teacher_insight"]
        if not insight:  # the blanked row: verl's own sequence
            assert sent == prompt_ids + response_ids
            continue
        # the privileged prompt, rendered independently by the model's own chat template with the row's tools
        schemas = offered_tools(
            item, [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in worker.tools]
        )
        expected = tokenizer.apply_chat_template(
            privileged_messages(list(item["raw_prompt"]), insight),
            tools=schemas,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert sent[: len(sent) - response] == list(expected) != prompt_ids
        text = tokenizer.decode(sent[: len(sent) - response])
        assert (
            HEADING in text
            and insight in text
            and text.index(item["extra_info"]["question"]) < text.index(HEADING)
        )
        assert insight not in tokenizer.decode(prompt_ids)  # the student never reads it
        by_prompt[i] = sent
    assert len(by_prompt) == 3


def test_teacher_logprobs_line_up_with_the_students_response_tokens(played):
    _config, _tokenizer, items, _teacher, _worker, out = played
    ids = response_view(out, "teacher_ids")
    logprobs = response_view(out, "teacher_logprobs")
    assert ids.shape == out.batch["responses"].shape == logprobs.shape
    for i in range(len(items)):
        _width, _prompt, response = _lengths(out, i)
        tokens = out.batch["responses"][i, :response]
        assert torch.equal(ids[i, :response].long(), tokens)
        expected = torch.tensor([teacher_logprob(int(t)) for t in tokens], dtype=logprobs.dtype)
        assert torch.allclose(logprobs[i, :response], expected)
        # a shift by one token would be caught: the neighbouring positions score other tokens
        assert not torch.equal(ids[i, 1 : response + 1].long(), tokens)
        assert not torch.equal(ids[i, : response - 1].long(), tokens[1:])


def test_tool_response_tokens_are_masked_as_verl_masks_them(played, bank, checkpoint):
    _config, tokenizer, items, _teacher, _worker, out = played
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    plain = composed(bank, checkpoint, "--recipe", "case", "--gpus", "8", "--no-opsd")
    assert plain.distillation.enabled is False
    batch, plain_items = batch_of(plain, tokenizer, blank=2)
    _w, reference = asyncio.run(rollout(AgentLoopWorker, plain, batch, plain_items))
    assert "teacher_logprobs" not in reference.batch
    assert torch.equal(out.batch["response_mask"], reference.batch["response_mask"])
    assert torch.equal(out.batch["responses"], reference.batch["responses"])
    for i in range(len(items)):
        _width, _prompt, response = _lengths(out, i)
        mask = out.batch["response_mask"][i, :response].bool()
        tokens = out.batch["responses"][i, :response]
        assert "<tool_response>" in tokenizer.decode(tokens[~mask]) and "<answer>" in tokenizer.decode(
            tokens[mask]
        )
        assert "<tool_response>" not in tokenizer.decode(tokens[mask])


def test_validation_rollouts_ask_no_teacher(played, bank, checkpoint):
    config, tokenizer, *_ = played
    batch, items = batch_of(config, tokenizer)
    # the `case` recipe's rubric weight, in every row as verl's dataset yields it (the bank's rows have none)
    assert {json.dumps(i["extra_info"]["reward_weights"]) for i in items} == {'{"rubric": 0.5}'}
    teacher = ScriptedTeacher()
    _w, out = asyncio.run(rollout(PrivilegedAgentLoopWorker, config, batch, items, teacher, validate=True))
    assert teacher.sent == [] and "teacher_logprobs" not in out.batch


def test_the_manager_builds_verls_manager_of_either_trainer_with_privileged_workers(played):
    from omegaconf import OmegaConf

    from case_env.verl import distill

    config = played[0]
    assert distill.PrivilegedTeacher in PrivilegedAgentLoopWorkerTQ.__mro__
    for use_v1, expected in ((True, PrivilegedAgentLoopWorkerTQ), (False, PrivilegedAgentLoopWorker)):
        config = OmegaConf.merge(config, {"trainer": {"use_v1": use_v1}})
        manager_class = distill._ManagerTQ if use_v1 else distill._Manager
        manager = manager_class(config=config, llm_client=None)
        assert manager.agent_loop_workers_class.__ray_actor_class__ is expected
    chosen = []
    original = (distill._ManagerTQ.create, distill._Manager.create)
    try:
        distill._ManagerTQ.create = classmethod(lambda cls, **kw: chosen.append("v1"))
        distill._Manager.create = classmethod(lambda cls, **kw: chosen.append("legacy"))
        PrivilegedAgentLoops.create(config=OmegaConf.merge(config, {"trainer": {"use_v1": True}}))
        PrivilegedAgentLoops.create(config=OmegaConf.merge(config, {"trainer": {"use_v1": False}}))
    finally:
        distill._ManagerTQ.create, distill._Manager.create = original
    assert chosen == ["v1", "legacy"]


@pytest.mark.parametrize(
    ("recipe", "opsd", "weight"),
    [("case", True, 0.5), ("case-abl-opsd", False, 0.5), ("case-abl-rlaif", True, 0.0)],
)
def test_cases_recipes_compose_and_validate_with_verl(bank, checkpoint, recipe, opsd, weight):
    config = composed(bank, checkpoint, "--recipe", recipe)
    assert config.distillation.enabled is opsd
    assert config.trainer.total_epochs == 1 and config.actor_rollout_ref.rollout.n == 8
    assert config.data.reward_weights.rubric == weight  # every row's, as the dataset class loads it
    manager = config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
    assert (manager == "case_env.verl.distill.PrivilegedAgentLoops") is opsd
    # the teacher takes 4 of 8 by default: 64 prompts x 8 on 6 student GPUs would pad every step
    assert config.trainer.n_gpus_per_node == (4 if opsd else 8)
    assert config.distillation.n_gpus_per_node == 4 if opsd else True


def test_the_case_recipes_dry_run_composes_and_validates(bank, checkpoint, capsys):
    from case_env.verl import grpo

    code = grpo.main(["--dry-run", "--recipe", "case", "--model", str(checkpoint), "--data", str(bank)])
    out = capsys.readouterr().out
    assert "dry run: config composed and validated" in out
    assert code == (2 if "  FAIL " in out else 0)  # a failed check (no GPU here) is the dry run's exit 2
    assert "distillation            OPSD: " in out and "carry teacher_insight" in out


def test_clinic_rows_distil_through_medexagents_own_loop(pneumonia, checkpoint, monkeypatch):  # noqa: F811
    """The clinic's option: its teacher_insight (the diagnosis and work-up) read by the teacher of an episode
    played through MedExAgent's loop, which renders no tool schemas (the rebuild finds that)."""
    from tests.test_clinic_loop import TURNS, _tokenizer, one_batch

    bank, server = pneumonia
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    config = composed(bank, checkpoint, "--recipe", "medexagent", "--opsd")
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "medexagent"
    batch = one_batch(config, _tokenizer(checkpoint))
    insight = batch.non_tensor_batch["extra_info"][0]["teacher_insight"]
    assert "Community-acquired pneumonia" in insight
    teacher = ScriptedTeacher()
    with contextlib.redirect_stdout(io.StringIO()):
        worker = PrivilegedAgentLoopWorker(config, llm_client=None, teacher_client={"default": teacher})
    worker.llm_client = ScriptedModel(
        worker.tokenizer, lambda text, images, turn: TURNS[min(turn, len(TURNS) - 1)]
    )
    out = asyncio.run(worker.generate_sequences(batch))
    (sent,) = teacher.sent
    _width, prompt, response = _lengths(out, 0)
    tokens = out.batch["responses"][0, :response]
    assert sent[len(sent) - response :] == tokens.tolist() and len(sent) - response > prompt
    privileged = worker.tokenizer.decode(sent[: len(sent) - response])
    assert HEADING in privileged and insight in privileged and "# Tools" not in privileged
    assert torch.equal(response_view(out, "teacher_ids")[0, :response].long(), tokens)


def test_the_teacher_reads_the_plain_prompt_when_no_privileged_one_can_be_made(played, caplog):
    import logging
    import types

    _config, _tokenizer, items, _teacher, worker, out = played
    teacher = ScriptedTeacher()
    worker.teacher_server_manager.teacher_client["default"] = teacher
    width, prompt, response = _lengths(out, 0)
    prompt_ids = out.batch["prompts"][0, width - prompt :].tolist()
    response_ids = out.batch["responses"][0, :response].tolist()
    sample = {"raw_prompt": list(items[0]["raw_prompt"]), "extra_info": items[0]["extra_info"]}

    def sent_for(prompt_ids, response_ids):
        output = types.SimpleNamespace(multi_modal_data={}, mm_processor_kwargs=None, extra_fields={})
        asyncio.run(worker._compute_teacher_logprobs(output, prompt_ids, response_ids, False, sample))
        assert len(output.extra_fields["teacher_ids"]) == len(prompt_ids) + len(response_ids)
        return teacher.sent[-1]

    with caplog.at_level(logging.WARNING, logger="case_env.verl.distill"):
        # a prompt the row's messages do not make (another loop's): verl's own sequence
        assert sent_for(prompt_ids[1:], response_ids) == prompt_ids[1:] + response_ids
        assert "could not be rebuilt" in caplog.text
        # a response that leaves the teacher no room for the insight
        long = response_ids * (worker._teacher_tokens() // len(response_ids))
        assert sent_for(prompt_ids, long) == prompt_ids + long
        assert "longer than the teacher serves" in caplog.text
        # and the row as it was: privileged
        assert HEADING in worker.tokenizer.decode(sent_for(prompt_ids, response_ids))
