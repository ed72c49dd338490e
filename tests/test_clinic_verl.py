"""The clinic environment through verl 0.9.1's real classes on CPU: bank rows through RLHFDataset with the
noise configuration intact, the stock ToolAgentLoop driving the scripted clinician through CaseTool, the
patient's history carried by the adapter, and verl's reward manager scoring with the clinic reward. The same
cases played by the HTTP eval runner give the same conversations and rewards: evaluation sees the noise
training sees."""

from __future__ import annotations

import asyncio
import json

import pytest
from verl.tools.tool_registry import load_all_tools

from case_env.core.bank import load_items, write
from case_env.envs.clinic.bank import build
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.reward import KEYS
from case_env.envs.clinic.synth import make_cases, write_csv
from case_env.eval.runner import run_eval
from case_env.medicine.exams import EXAMS
from case_env.reward import FAILURE_KEYS
from case_env.verl.config import path_for
from case_env.verl.dataset import CaseRLHFDataset
from case_env.verl.offline import build_tokenizer
from case_env.verl.rollouts import play
from tests.server_harness import live_server
from tests.test_clinic_server import env
from tests.verl_rows import REPO, dataset_config

NOISE = NoiseConfig(seed=7, patient_rate=0.5, exam_rate=0.3)


@pytest.fixture(scope="module", params=["dialogue", "ask_patient"])
def clinic(tmp_path_factory, dataset, request):
    """A bank of either patient channel: MedExAgent's loop (plain text to the patient) or verl's tool_agent."""
    tmp = tmp_path_factory.mktemp("clinic-verl")
    cases = make_cases(40, seed=1)
    write_csv(cases, tmp / "cases" / "clinic_synthetic.csv")
    bank = build(cases, seed=1, fractions=(1.0, 0.0, 0.0), noise=NOISE, patient=request.param)
    write(bank, tmp / "bank", {"env": "clinic"})
    with env(CASE_ENV_CLINIC_CASES=tmp / "cases"), live_server(dataset, tmp) as live:
        yield tmp / "bank", live


def test_clinic_rows_through_verl_tool_agent_loop_and_reward_manager(clinic, monkeypatch, tmp_path):
    bank, server = clinic
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    tools = load_all_tools(tool_config_path=str(REPO / path_for("clinic")), function_tool_path=None)
    data = CaseRLHFDataset(
        data_files=[str(bank / "train.parquet")],
        tokenizer=build_tokenizer(),
        config=dataset_config(),
        processor=None,
    )
    items = [data[i] for i in range(len(data))][:24]
    for item in items:
        create = item["tools_kwargs"]["ask_patient"]["create_kwargs"]
        assert create["patient_id"] == item["extra_info"]["patient_id"]
        assert {k: create["noise"][k] for k in ("seed", "patient_rate", "exam_rate")} == {
            k: NOISE.model_dump()[k] for k in ("seed", "patient_rate", "exam_rate")
        }
        spoken = item["agent_name"] == "medexagent"
        assert (item["extra_info"]["tool_selection"][0] == "ask_patient") != spoken

    outputs, models, scores = asyncio.run(play(items, tools, len(items)))
    # the same cases through the eval runner
    # the `noisy` protocol plays the bank's noise and personas, as training does
    run_eval(
        bank / "train.parquet",
        server.url,
        "clinician",
        tmp_path,
        limit=len(items),
        progress=False,
        protocol="noisy",
    )
    records = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    by_key = {r["patient_id"]: r for r in records}
    correct = 0
    for out, model, item, score in zip(outputs, models, items, scores, strict=True):
        calls = out.extra_fields["case_env_tool_calls"]
        dialogue = [c for c in calls if c["tool"] == "ask_patient"]
        assert calls and not any(c["infra_error"] for c in calls)
        assert [c["tool"] for c in calls][: len(dialogue)] == ["ask_patient"] * len(dialogue)
        assert len(dialogue) >= 2 and dialogue[0]["text"] != dialogue[1]["text"]
        # the model was offered only the row's tools: (ask_patient,) the work-up's exam tools, the distractors;
        # MedExAgent's loop lists them in its system prompt and renders no tool block
        offered = item["extra_info"]["tool_selection"]
        listed = [f"- Name: {name}\n" if spoken else f'"name": "{name}"' for name in offered]
        assert all(entry in model.prompts[0] for entry in listed)
        assert "order_exam" not in model.prompts[0] and "render_slice" not in model.prompts[0]
        assert all(c["tool"] in offered or (spoken and c["tool"] == "ask_patient") for c in calls)
        extra = score["reward_extra_info"]
        assert set(extra) == {*KEYS, *FAILURE_KEYS} and extra["profile"] == "medexagent"
        assert extra["asks"] == len(dialogue) and extra["format_ok"]
        correct += extra["acc"]
        # the same case through the eval runner: the same conversation, the same reward
        record = by_key[item["extra_info"]["patient_id"]]
        if spoken:  # the patient's replies are user turns
            replies = [m["content"] for m in record["messages"] if m["role"] == "user"]
        else:
            replies = [m["content"][-1]["text"] for m in record["messages"] if m["role"] == "tool"]
        assert replies[: len(dialogue)] == [d["text"] for d in dialogue]
        direct = record["score"]
        assert direct["pred"] == extra["pred"] and direct["exams"] == extra["exams"]
        assert direct["score"] == pytest.approx(score["reward_score"], abs=1e-6)
    assert correct / len(items) >= 0.8
    audit = [json.loads(line) for line in server.state.settings.audit_log.read_text().splitlines()]
    ran = {r["tool"] for r in audit}
    assert "ask_patient" in ran and len(ran - {"ask_patient"}) >= 3 and ran <= {"ask_patient", *EXAMS}


def test_the_adapter_forwards_noise_and_history(clinic, monkeypatch):
    """A trajectory's second question is answered with the first exchange as history (one AgentData)."""
    bank, server = clinic
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    tools = {
        t.name: t
        for t in load_all_tools(tool_config_path=str(REPO / path_for("clinic")), function_tool_path=None)
    }
    item = load_items(bank / "train.parquet")[0]
    create = item.extra["tools_kwargs"]["ask_patient"]

    class Agent:  # what CaseTool reads of verl's AgentData
        def __init__(self):
            self.request_id = "traj-1"
            self.extra_fields: dict = {}

    agent = Agent()

    async def ask(question: str):
        instance, _ = await tools["ask_patient"].create(**create)
        response, _, metrics = await tools["ask_patient"].execute(
            instance, {"question": question}, agent_data=agent
        )
        await tools["ask_patient"].release(instance)
        return response.text, metrics

    async def conversation():
        return [await ask("What brings you in?"), await ask("Anything else?"), await ask("Anything else?")]

    answers = asyncio.run(conversation())
    assert all(m["status"] == "ok" for _, m in answers)
    assert [c["arguments"]["question"] for c in agent.extra_fields["case_env_tool_calls"]] == [
        "What brings you in?",
        "Anything else?",
        "Anything else?",
    ]
    assert answers[1][0] != answers[0][0]
    assert answers[2][0] != answers[1][0] or "everything" in answers[2][0]
