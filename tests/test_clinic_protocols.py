"""MedExAgent's evaluation protocols (`case-env eval --protocol conversation|diagnosis`) on cases in its own
file layouts: a record of its evaluation JSONL (`{pmc,ddxplus}_test_conversations_clean.jsonl`: a
conversation whose tool messages already hold its result sentences, the offered exams listed in its system
prompt) and a row of its `build_verl_dataset` parquet (JSON strings inside `extra_info`), served by a live
server and played by the scripted clinician through the eval runner."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from case_env.core.bank import load_items, write
from case_env.envs.clinic.bank import build
from case_env.envs.clinic.cases import load_cases
from case_env.envs.clinic.noise import NoiseConfig
from case_env.eval.runner import run_eval
from tests.server_harness import live_server
from tests.test_clinic_server import env

CT_SENTENCE = "The CT scan of the chest shows: Right lower lobe consolidation with air bronchograms"
SYSTEM = (
    "You are an experienced physician conducting a medical consultation.\n\nAVAILABLE EXAMINATIONS:\n"
    "- Name: ct\n  Description: CT\n- Name: cbc\n  Description: CBC\n- Name: eeg\n  Description: EEG\n"
    "- Name: mri\n  Description: MRI\n"
)
RECORD = {
    "patient_id": "pmc-17",
    "diagnosis": "Community-acquired pneumonia",
    "demographics": {"age": "58", "gender": "Male", "race": "nan", "additional_demographics": ""},
    "medical_history": "Type 2 diabetes",
    "self_reported_symptoms": "a cough with green phlegm for 5 days, fever, pain in my chest when I breathe",
    "patient_persona": {"personality": {"key": "plain"}},
    "conversation": [
        {"role": "system", "content": SYSTEM},
        {"role": "assistant", "content": "Hello, what brings you in today?"},
        {"role": "user", "content": "I've had a bad cough with green phlegm and a fever."},
        {
            "role": "assistant",
            "content": "Let me take a look with a CT.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "ct", "arguments": '{"region": "chest", "contrast": "yes"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": CT_SENTENCE},
        {
            "role": "assistant",
            "content": "And a blood count.",
            "tool_calls": [
                {"id": "call_2", "type": "function", "function": {"name": "cbc", "arguments": "{}"}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_2",
            "content": "The complete blood count results: White cells 15.2 x10^9/L with neutrophilia",
        },
        {
            "role": "assistant",
            "content": "This is a chest infection. [DIAGNOSIS: Community-acquired pneumonia]",
        },
    ],
}


def verl_row() -> dict:
    exam_map = {
        'xray(region="chest")': {
            "parsed": {"name": "xray", "arguments": {"region": "chest"}},
            "findings": "Left lower lobe opacity",
        },
        "cbc()": {"parsed": {"name": "cbc", "arguments": {}}, "findings": "White cells 14.1, neutrophilia"},
    }
    extra = {
        "patient_index": 3,
        "data_source": "pmc",
        "exam_map": json.dumps(exam_map),
        "available_tools": json.dumps(["cbc", "eeg", "xray", "mri", "ecg"]),
        "ground_truth": "Community-acquired pneumonia",
        "demographics": json.dumps(
            {"age": "61", "gender": "Female", "race": "", "additional_demographics": ""}
        ),
        "medical_history": "COPD",
        "self_reported_symptoms": "a cough with green phlegm for 3 days, fever, pain in my chest when I breathe",
        "patient_persona": json.dumps({"personality": {"key": "plain"}}),
        "exam_noise_map": "{}",
        "interaction_kwargs": json.dumps({"name": "patient", "assigned_noise_types": []}),
    }
    return {
        "prompt": [{"role": "system", "content": "You are an experienced physician..."}],
        "reward_model": {"ground_truth": "Community-acquired pneumonia"},
        "data_source": "medagent_pmc",
        "extra_info": extra,
    }


@pytest.fixture(scope="module")
def medexagent_files(tmp_path_factory, dataset):
    tmp = tmp_path_factory.mktemp("medexagent-files")
    (tmp / "cases").mkdir()
    (tmp / "cases" / "pmc_test_conversations_clean.jsonl").write_text(json.dumps(RECORD) + "\n")
    pq.write_table(pa.Table.from_pylist([verl_row()]), tmp / "cases" / "train_verl.parquet")
    cases = load_cases([tmp / "cases"]).cases
    write(build(cases, 0, (1.0, 0.0, 0.0), NoiseConfig()), tmp / "bank", {"env": "clinic"})
    with env(CASE_ENV_CLINIC_CASES=tmp / "cases"), live_server(dataset, tmp) as live:
        yield tmp, cases, live


def test_medexagents_files_are_read_as_written(medexagent_files):
    tmp, cases, _ = medexagent_files
    by_file = {c.case_id.split("-")[0]: c for c in cases}
    record = by_file["pmc_test_conversations_clean"]
    assert record.split == "test" and by_file["train_verl"].split == "train"  # the files' own splits
    assert record.offered == ("ct", "cbc", "eeg", "mri")  # from its system prompt
    assert record.exams[0].findings == "Right lower lobe consolidation with air bronchograms"
    assert record.race == ""  # pandas' "nan" is an empty cell
    items = {i.extra["patient_id"]: i for i in load_items(tmp / "bank")}
    assert items[record.case_id].extra["tool_selection"] == ["ct", "cbc", "eeg", "mri"]


@pytest.mark.parametrize("protocol", ["conversation", "diagnosis"])
def test_both_protocols_play_medexagents_rows(medexagent_files, tmp_path, protocol):
    tmp, cases, server = medexagent_files
    out = tmp_path / protocol
    results = run_eval(tmp / "bank", server.url, "clinician", out, protocol=protocol, progress=False)
    assert results["protocol"] == protocol and results["overall"]["n"] == 2
    records = {
        r["patient_id"]: r for r in map(json.loads, (out / "trajectories.jsonl").read_text().splitlines())
    }
    record = records[next(c.case_id for c in cases if c.split == "test")]
    tool_texts = [m["content"] for m in record["messages"] if m["role"] == "tool"]
    overall = results["overall"]
    assert overall["accuracy_strict"] == 1.0 and overall["diagnosis_found"] == 1.0
    assert overall["tool_hallucination_rate"] == 0.0
    if protocol == "conversation":
        # from scratch: the patient answers plain text as user turns, exams run on the server, MedExAgent's
        # result sentence wraps the recorded findings once
        assert record["messages"][0]["role"] == "system" and len(record["messages"][0]) == 2
        assert record["messages"][2]["role"] == "user" and record["score"]["asks"] >= 1
        assert CT_SENTENCE in tool_texts and not any("shows: The CT scan" in t for t in tool_texts)
        assert record["noise"] == [] and overall["num_tool_calls"] >= 1
    else:
        # the recorded consultation up to its diagnosis turn, then one turn: the diagnosis
        assert record["messages"][: len(RECORD["conversation"]) - 1] == RECORD["conversation"][:-1]
        assert record["turns"] == 1 and record["answer"].lower() == "community-acquired pneumonia"


def test_an_unknown_protocol_is_refused_naming_the_protocols(medexagent_files, tmp_path):
    tmp, _, server = medexagent_files
    with pytest.raises(ValueError, match="choose one of conversation, diagnosis, noisy"):
        run_eval(
            tmp / "bank", server.url, "clinician", tmp_path / "x", protocol="interactive", progress=False
        )


def test_an_eval_files_gold_calls_are_kept_as_written_repeats_included(tmp_path):
    """MedExAgent's evaluation scores the tool calls against every gold call of the conversation
    (`prepare_eval_sample`: ground_truth_tools), a repeated one twice."""
    from case_env.core.calls import call_text
    from case_env.envs.clinic.reward import clinic_score
    from tests.test_clinic_medexagent import ref_tool_reward

    conversation = [dict(m) for m in RECORD["conversation"]]
    repeat = {
        "role": "assistant",
        "content": "Once more.",
        "tool_calls": [{"id": "call_3", "type": "function", "function": {"name": "cbc", "arguments": "{}"}}],
    }
    answer = {"role": "tool", "tool_call_id": "call_3", "content": "The complete blood count results: WBC 16"}
    conversation[-1:-1] = [repeat, answer]
    (tmp_path / "pmc_test_conversations_clean.jsonl").write_text(
        json.dumps({**RECORD, "conversation": conversation}) + "\n"
    )
    (case,) = load_cases([tmp_path]).cases
    assert case.gold == ('ct(region="chest", contrast="yes")', "cbc()", "cbc()") and len(case.exams) == 2
    (row,) = build([case], 0, (1.0, 0.0, 0.0), NoiseConfig()).rows["test"]
    exams = json.loads(row["extra_info"])["clinic"]["exams"]
    assert exams == list(case.gold)
    text = call_text("cbc", {}) + "\n[DIAGNOSIS: Community-acquired pneumonia]"
    score = asyncio.run(clinic_score(text, case.diagnosis, {"clinic": {"exams": exams}}))
    gt = [
        {"name": "ct", "arguments": {"region": "chest", "contrast": "yes"}},
        {"name": "cbc", "arguments": {}},
        {"name": "cbc", "arguments": {}},
    ]
    assert score["tool_match"] == pytest.approx(ref_tool_reward([{"name": "cbc", "arguments": {}}], gt))


def test_a_model_served_without_a_tool_parser_plays_the_conversation_protocol(medexagent_files, tmp_path):
    """MedExAgent-8B on an OpenAI-compatible server with no tool parser: it greets and asks in plain text,
    writes two hermes `<tool_call>` blocks in one turn, then `[DIAGNOSIS: ...]`. The runner reads the calls
    from its text, runs both, and sends their results back as one user turn of `<tool_response>` blocks; the
    patient's replies come back as user turns."""
    from case_env.core.calls import call_text
    from case_env.eval.openai_agent import ModelSettings
    from tests.chat_stub import ScriptedChat
    from tests.server_harness import serve_app

    turns = [
        "Hello, I'm Dr. Lee. What brings you in today?",
        "How long have you had the cough?",
        "Let me order two tests.\n"
        + call_text("ct", {"region": "chest", "contrast": "yes"})
        + "\n"
        + call_text("cbc", {}),
        "The tests show a pneumonia. [DIAGNOSIS: Community-acquired pneumonia]",
    ]
    chat = ScriptedChat(lambda messages: turns[sum(m["role"] == "assistant" for m in messages)])
    tmp, cases, server = medexagent_files
    with serve_app(chat.app) as model_server:
        model = ModelSettings(base_url=f"{model_server.url}/v1", model="medexagent-8b")
        results = run_eval(tmp / "bank", server.url, "openai", tmp_path, model=model, progress=False)
    records = {
        r["patient_id"]: r
        for r in map(json.loads, (tmp_path / "trajectories.jsonl").read_text().splitlines())
    }
    record = records[next(c.case_id for c in cases if c.split == "test")]
    asked = [r for r in chat.requests if r["messages"][-1]["role"] == "user"]
    assert len(chat.requests) == 8 and len(asked) == 6  # 2 cases x (2 patient replies + 1 results turn)
    results_turns = [
        r["messages"][-1]["content"] for r in asked if "<tool_response>" in r["messages"][-1]["content"]
    ]
    assert len(results_turns) == 2 and all(t.count("<tool_response>") == 2 for t in results_turns)
    assert any(CT_SENTENCE in t for t in results_turns)
    assert any("The requested exam is not available." in t for t in results_turns)
    score = record["score"]
    assert (score["dx"], score["tool_match"], score["exams"], score["asks"]) == (1.0, 1.0, 2, 2)
    assert score["hallucinated"] == 0 and record["turns"] == 4
    # the other case offers no CT: MedExAgent's sentence, and one of its two calls counts as hallucinated
    other = next(r for pid, r in records.items() if pid != record["patient_id"])
    assert other["score"]["hallucinated"] == 1
    assert results["overall"]["tool_hallucination_rate"] == pytest.approx(0.25)
