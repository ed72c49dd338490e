"""MedExAgent's agent loop (`case_env.envs.clinic.agent_loop`) through verl 0.9.1's real AgentLoopWorker on CPU,
composed by the launcher's `--recipe medexagent`, against a live server: a policy that talks as MedExAgent-8B
does (greets and asks in plain text, orders two exams in one turn, writes `[DIAGNOSIS: ...]`) gets the reward
MedExAgent's formulas give its episode (written from `train/rl/reward.py` in test_clinic_medexagent.py), and
the same turns under verl's stock `tool_agent` end on the first one."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import types

import pytest

from case_env.core.bank import write
from case_env.core.calls import FIELD, call_text
from case_env.envs.clinic.bank import build
from case_env.envs.clinic.cases import ClinicCase, read_csv
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.synth import write_csv
from case_env.medicine.exams import recorded_exam
from case_env.verl.offline import ScriptedModel, score_with_verl
from tests.server_harness import live_server
from tests.test_clinic_medexagent import ref_cost, ref_tool_reward
from tests.test_clinic_server import env

CT = ("ct", {"region": "chest", "contrast": "yes"})
CBC = ("cbc", {})
TURNS = [
    "Hello, I'm Dr. Lee. What brings you in today?",
    "I'm sorry to hear that. How long have you had the cough?",
    "Have you had a fever or chills?",
    "Let me order a chest CT and a blood count.\n" + call_text(*CT) + "\n" + call_text(*CBC),
    "The CT shows consolidation and your white count is up.\n[DIAGNOSIS: Community-acquired pneumonia]",
]


@pytest.fixture(scope="module")
def pneumonia(tmp_path_factory, dataset):
    tmp = tmp_path_factory.mktemp("medexagent-loop")
    exams = (
        recorded_exam('ct(region="chest", contrast="yes")', "Right lower lobe consolidation"),
        recorded_exam("cbc()", "White cells 15.2 x10^9/L with neutrophilia"),
    )
    symptoms = "a cough with green phlegm for 5 days, fever, pain in my chest when I breathe"
    case = ClinicCase("p", "pmc", "Community-acquired pneumonia", symptoms, "58", "Male", exams=exams)
    write_csv([case], tmp / "cases" / "pmc_cases.csv")
    cases = read_csv(tmp / "cases" / "pmc_cases.csv").cases
    write(build(cases, 0, (1.0, 0.0, 0.0), NoiseConfig()), tmp / "bank", {"env": "clinic"})
    with env(CASE_ENV_CLINIC_CASES=tmp / "cases"), live_server(dataset, tmp) as live:
        yield tmp / "bank", live


def composed(bank, model_dir):
    from case_env.verl import launch, options

    argv = ["--dry-run", "--recipe", "medexagent", "--model", str(model_dir), "--data", str(bank)]
    args, extra = options.parse(argv)
    args.tool_config = launch.bank_tool_config(bank)
    return launch.compose(launch.Plan(args, extra).overrides())


@functools.cache
def _rows(data_config: str, tokenizer):
    """verl's dataset over the bank under the composed `data` config (as YAML), built once (its prompt-length
    filter takes seconds); each item read from it is new, so a rollout's reward manager cannot touch another's
    extra_info."""
    from omegaconf import OmegaConf

    from case_env.verl.dataset import CaseRLHFDataset

    config = OmegaConf.create(data_config)
    return CaseRLHFDataset(
        data_files=[config.train_files], tokenizer=tokenizer, config=config, processor=None
    )


def one_batch(config, tokenizer, agent_name: str | None = None):
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    data = _rows(OmegaConf.to_yaml(config.data), tokenizer)
    batch = DataProto.from_single_dict(collate_fn([data[0]]))
    if agent_name is not None:
        batch.non_tensor_batch["agent_name"][:] = agent_name
    return batch


async def rollout(config, batch, turns):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    with contextlib.redirect_stdout(io.StringIO()):  # verl prints every tool schema it loads
        worker = AgentLoopWorker(config, llm_client=None)
    model = ScriptedModel(worker.tokenizer, lambda text, images, turn: turns[min(turn, len(turns) - 1)])
    worker.llm_client = model
    out = await worker.generate_sequences(batch)
    prompt_length = out.batch["prompts"].shape[1]
    keep = out.batch["attention_mask"][0, prompt_length:].bool()
    fields = {
        k: out.non_tensor_batch[k][0]
        for k in (FIELD, "turn_scores", "tool_rewards")
        if k in out.non_tensor_batch
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    played = types.SimpleNamespace(
        prompt_ids=out.batch["prompts"][0][out.batch["attention_mask"][0, :prompt_length].bool()].tolist(),
        response_ids=out.batch["responses"][0][keep].tolist(),
        extra_fields=fields,
    )
    mask = out.batch["response_mask"][0][keep]
    item = {k: batch.non_tensor_batch[k][0] for k in ("data_source", "reward_model", "extra_info")}
    (score,) = await score_with_verl(worker.tokenizer, [played], [item])
    return model, played, mask, score, int(out.non_tensor_batch["__num_turns__"][0])


def test_medexagent_8b_talks_to_the_patient_through_its_loop_and_earns_medexagents_reward(
    pneumonia, checkpoint, monkeypatch
):
    bank, server = pneumonia
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    config = composed(bank, checkpoint)
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "medexagent"
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == config.data.train_batch_size == 64
    batch = one_batch(config, _tokenizer(checkpoint))
    assert list(batch.non_tensor_batch["agent_name"]) == ["medexagent"]
    model, played, mask, score, turns = asyncio.run(rollout(config, batch, TURNS))
    assert len(model.prompts) == 5 and turns == 5 + 4 + 1  # assistant turns + user turns + 1, as verl counts
    calls = played.extra_fields[FIELD]
    assert [(c["tool"], c["status"]) for c in calls] == [("ask_patient", "ok")] * 3 + [
        ("ct", "ok"),
        ("cbc", "ok"),
    ]
    assert calls[0]["arguments"] == {"question": TURNS[0]}
    # the patient's reply is a user turn, not a tool response; both exams answered in the next prompt
    second = model.prompts[1].split(TURNS[0], 1)[1]
    assert second.startswith("<|im_end|>\n<|im_start|>user\n") and "<tool_response>" not in second
    assert calls[0]["text"] in second
    last = model.prompts[4]
    assert "The CT scan of the chest shows: Right lower lobe consolidation" in last
    assert "White cells 15.2" in last and last.count("<tool_response>") == 2
    # no tool block rendered: the exams are listed in MedExAgent's system prompt
    assert "# Tools" not in model.prompts[0] and "- Name: ct" in model.prompts[0]
    # only the doctor's tokens are trained on
    tokenizer = _tokenizer(checkpoint)
    trained = tokenizer.decode([t for t, m in zip(played.response_ids, mask.tolist(), strict=True) if m])
    assert calls[0]["text"] not in trained and "Right lower lobe" not in trained and "[DIAGNOSIS:" in trained
    # MedExAgent's reward: dx 1 (judge-free), ToolRL and cost on the two exams, its format penalty counts the
    # two-call turn as an error (weight 0 in its RL config)
    pred = gt = [{"name": "ct", "arguments": CT[1]}, {"name": "cbc", "arguments": {}}]
    expected = 1.0 * 1.0 + 0.5 * ref_tool_reward(pred, gt) - 0.1 * ref_cost(pred, gt)
    extra = score["reward_extra_info"]
    assert (extra["dx"], extra["tool_match"], extra["cost"], extra["format"]) == (1.0, 1.0, 0.0, 1.0)
    assert extra["asks"] == 3 and extra["exams"] == 2
    assert score["reward_score"] == pytest.approx(expected, abs=1e-9) and expected == 1.5


def test_the_same_turns_under_verls_tool_agent_end_on_the_greeting(pneumonia, checkpoint, monkeypatch):
    bank, server = pneumonia
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    config = composed(bank, checkpoint)
    batch = one_batch(config, _tokenizer(checkpoint), agent_name="tool_agent")
    model, played, _mask, score, turns = asyncio.run(rollout(config, batch, TURNS))
    assert len(model.prompts) == 1 and turns == 2 and not played.extra_fields.get(FIELD)
    assert "# Tools" in model.prompts[0]  # verl's loop renders the schemas; MedExAgent's does not
    assert score["reward_score"] == 0.0 and score["reward_extra_info"]["pred"] == ""


def test_the_loop_stops_asking_at_the_user_turn_limit_but_lets_exams_run_to_the_assistant_limit(
    pneumonia, checkpoint, monkeypatch
):
    bank, server = pneumonia
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    config = composed(bank, checkpoint)
    config.actor_rollout_ref.rollout.multi_turn.max_user_turns = 2
    config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns = 6
    tokenizer = _tokenizer(checkpoint)  # a batch per rollout: verl's reward manager updates its extra_info

    def play(turns):
        return asyncio.run(rollout(config, one_batch(config, tokenizer), turns))

    # two questions fill the user-turn limit: the third plain turn ends the episode
    model, played, _m, _s, _t = play(["Hello?", "And?", "Anything else?"])
    assert len(model.prompts) == 3 and [c["tool"] for c in played.extra_fields[FIELD]] == ["ask_patient"] * 2
    # exams are not bounded by it: after two questions, four exam turns run until the sixth assistant turn
    model, played, _m, _s, _t = play(["Hello?", "And?", *[call_text(*CBC)] * 4])
    assert len(model.prompts) == 6
    assert [c["tool"] for c in played.extra_fields[FIELD]] == ["ask_patient"] * 2 + ["cbc"] * 3
    # an exam the row does not offer is answered with MedExAgent's sentence, without reaching the server,
    # and the reward counts it as MedExAgent's executor does
    offered = one_batch(config, tokenizer).non_tensor_batch["extra_info"][0]["tool_selection"]
    absent = next(n for n in ("mri", "pet_scan", "angiography", "eeg") if n not in offered)
    model, played, _m, score, _t = play([call_text(absent, {}), "[DIAGNOSIS: pneumonia]"])
    assert "The requested exam is not available." in model.prompts[1]
    assert not played.extra_fields.get(FIELD) and score["reward_extra_info"]["exams"] == 1


@functools.cache
def _tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_the_preflight_rehearses_a_dialogue_row_through_its_own_loop(pneumonia, checkpoint):
    """`case-env train preflight`'s chat-template check plays the row through the loop it names: MedExAgent's
    renders no tool schemas (its prompt lists the exams) and ends on `[DIAGNOSIS: ...]`."""
    from verl.tools.tool_registry import load_all_tools

    from case_env.verl import model_files
    from case_env.verl.checks import template_problems
    from case_env.verl.dataset import offered_tools
    from case_env.verl.rehearsal import rehearse

    bank, _ = pneumonia
    config = composed(bank, checkpoint)
    files = model_files.load(checkpoint)
    item = one_batch(config, files.tokenizer)
    row = {k: v[0] for k, v in item.non_tensor_batch.items()}
    with contextlib.redirect_stdout(io.StringIO()):
        tools = load_all_tools(tool_config_path=str(bank / "verl_tools.yaml"), function_tool_path=None)
    tool_schemas = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools]
    offered = offered_tools(row, tool_schemas)
    episode = rehearse(files, config, row, tool_schemas, offered)
    assert not episode.renders_tools and episode.final.endswith("[DIAGNOSIS: community-acquired pneumonia]")
    assert episode.executed == [episode.tool] and "# Tools" not in episode.prompt  # no schema block
    assert template_problems(files, config, row, tool_schemas, offered) == []
