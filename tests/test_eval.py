"""`case-env eval` against the live server: accuracy of the model-free policies, the trajectory format with
images on disk, resume without redoing work, and the prompt-only baselines staying near chance."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from case_env.core.trajectory import FILENAME, read
from case_env.eval.runner import run_eval
from tests.server_harness import live_server


@pytest.fixture(scope="module")
def server(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("eval-server")) as live:
        yield live


def test_scripted_run_writes_results_and_case_trajectories(bank, server, tmp_path):
    results = run_eval(bank / "test.parquet", server.url, "scripted", tmp_path, concurrency=3, progress=False)
    assert set(results) == {
        *("env", "overall", "by_data_source", "agent", "bank", "server_version", "sampling", "components")
    }
    # each component of the reward, its mean over the run: the answer's is the run's accuracy
    records = list(read(tmp_path / FILENAME))
    assert results["components"]["acc"] == round(sum(r["score"]["acc"] for r in records) / len(records), 4)
    assert results["components"]["acc"] == pytest.approx(results["overall"]["accuracy"], abs=1e-4)
    assert 0.0 < results["components"]["rubric"] <= 1.0
    assert results["sampling"] == {
        "samples_per_row": 0,
        "repeats": 1,
        "seed": 0,
        "sampler": "scripted agent 'scripted', draws seeded by --seed",
    }
    assert results["agent"] == "scripted" and results["server_version"]
    for source in ("vista3d_opsd", "medboard_opsd"):
        summary = results["by_data_source"][source]
        assert summary["accuracy"] == 1.0 and summary["n"] > 0
        assert summary["mean_tool_calls"] >= 2 and summary["format_error_rate"] == 0.0
    records = list(read(tmp_path / FILENAME))
    assert len(records) == results["overall"]["n"]
    record = records[0]
    roles = [m["role"] for m in record["messages"]]
    assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
    assert (
        roles.count("tool")
        == record["tool_calls"]
        == sum(1 for m in record["messages"] if m.get("tool_calls"))
    )
    assert record["messages"][-1]["content"].endswith(f"<answer>{record['answer']}</answer>")
    assert {t["function"]["name"] for t in record["tools"]} >= {"list_visits"}


def test_vision_run_saves_the_images_it_saw(bank, server, tmp_path):
    results = run_eval(bank / "test.parquet", server.url, "vision", tmp_path, concurrency=2, progress=False)
    panel = results["by_data_source"]["medpanel_v2_opsd"]
    assert panel["accuracy"] == 1.0
    with_images = [r for r in read(tmp_path / FILENAME) if r["images"]]
    assert with_images
    for record in with_images:
        parts = [
            p for m in record["messages"] if m["role"] == "tool" for p in m["content"] if p["type"] == "image"
        ]
        assert [p["image"] for p in parts] == record["images"]
        for relative in record["images"]:
            assert relative.startswith(f"images/{record['case_id']}/img_")
            assert Image.open(tmp_path / relative).size[0] > 0


def test_resume_skips_finished_items_and_refuses_to_overwrite(bank, server, tmp_path):
    first = run_eval(bank, server.url, "scripted", tmp_path, limit=6, progress=False)
    assert first["overall"]["n"] == 6
    with pytest.raises(FileExistsError, match="--resume"):
        run_eval(bank, server.url, "scripted", tmp_path, limit=9, progress=False)
    lines = (tmp_path / FILENAME).read_text().splitlines()
    (tmp_path / FILENAME).write_text("\n".join(lines) + "\n" + lines[-1][:40])  # a run killed mid-write
    second = run_eval(bank, server.url, "scripted", tmp_path, limit=9, resume=True, progress=False)
    ids = [r["id"] for r in read(tmp_path / FILENAME)]
    assert second["overall"]["n"] == 9 and len(ids) == len(set(ids)) == 9


def test_repeats_roll_each_question_out_several_times_and_resume(bank, server, tmp_path):
    from case_env.core.trajectory import TrajectoryFormatError

    first = run_eval(
        bank / "test.parquet", server.url, "random", tmp_path, repeats=3, limit=5, progress=False
    )
    assert first["overall"] == {**first["overall"], "n": 15, "questions": 5, "repeats": 3}
    records = list(read(tmp_path / FILENAME))
    ids = [r["id"] for r in records]
    assert len(set(ids)) == 15
    by_question: dict[str, list[dict]] = {}
    for record in records:
        by_question.setdefault(record["question_id"], []).append(record)
    assert all(sorted(r["repeat"] for r in rs) == [0, 1, 2] for rs in by_question.values())
    # each repeat is its own draw: across 5 questions x 3 repeats the letters cannot all agree per question
    assert any(len({r["answer"] for r in rs}) > 1 for rs in by_question.values())
    assert first["overall"]["accuracy"] == round(sum(r["reward"] for r in records) / 15, 4)
    again = run_eval(
        bank / "test.parquet", server.url, "random", tmp_path, repeats=4, limit=5, resume=True, progress=False
    )
    assert again["overall"]["n"] == 20
    assert [r["id"] for r in read(tmp_path / FILENAME)][:15] == ids  # only the fourth repeat was added
    # a damaged line in the middle is named, not skipped: skipping it would silently lose a record
    lines = (tmp_path / FILENAME).read_text().splitlines(keepends=True)
    lines[3] = lines[3][:50] + "\n"
    (tmp_path / FILENAME).write_text("".join(lines))
    with pytest.raises(TrajectoryFormatError, match=f"{FILENAME}:4: not a JSON record"):
        run_eval(
            bank / "test.parquet",
            server.url,
            "random",
            tmp_path,
            repeats=4,
            limit=5,
            resume=True,
            progress=False,
        )


@pytest.mark.parametrize("agent", ["no-tool", "random"])
def test_prompt_only_baselines_make_no_calls_and_stay_near_chance(bank, server, tmp_path, agent):
    # both guess uniformly where the prompt holds no tell: three draws per row, so one lucky draw of 90
    # letters does not decide the bound
    repeats = 3
    results = run_eval(bank, server.url, agent, tmp_path, concurrency=4, repeats=repeats, progress=False)
    n = results["overall"]["n"]
    assert n >= 80 * repeats
    assert all(s["mean_tool_calls"] == 0 for s in results["by_data_source"].values())
    # 10 patients only: a loose bound here; the acceptance figures use a bank of 30 patients
    assert results["overall"]["accuracy"] <= 0.25 + 0.12, json.dumps(results["by_data_source"])


def test_trajectories_become_verl_multiturn_sft_rows(bank, server, tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    from case_env.core.sft_data import write_sft
    from case_env.verl.offline import build_tokenizer

    run = tmp_path / "run"
    results = run_eval(bank / "test.parquet", server.url, "scripted", run, concurrency=2, progress=False)
    correct = round(results["overall"]["accuracy"] * results["overall"]["n"])
    text_only = tmp_path / "text-only"
    text_only.mkdir()
    records = [r for r in read(run / FILENAME) if not r["images"]]
    (text_only / "traj.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert write_sft(run, tmp_path / "all.parquet", correct_only=False) == results["overall"]["n"]
    assert write_sft(run, tmp_path / "correct.parquet") == correct
    n = write_sft(text_only, tmp_path / "sft.parquet")
    config = OmegaConf.create({"max_length": 65536, "truncation": "error"})
    data = MultiTurnSFTDataset(str(tmp_path / "sft.parquet"), build_tokenizer(), config)
    assert len(data) == n > 0
    item = data[0]
    text = build_tokenizer().decode(item["input_ids"][item["attention_mask"].bool()])
    first = next(r for r in records if r["reward"] == 1)
    assert first["messages"][-1]["content"] in text and '"name": "list_visits"' in text
    assert item["loss_mask"].sum() > 0


@pytest.mark.parametrize("agent", ["scripted", "vision"])
def test_replay_reproduces_every_tool_output_and_reward(bank, server, tmp_path, agent):
    import httpx

    live = tmp_path / "live"
    first = run_eval(bank / "test.parquet", server.url, agent, live, concurrency=2, progress=False)
    # the replay server sees no imaging data at all
    with live_server(tmp_path / "no-data", tmp_path / "replay-server", replay_dir=live) as replayed:
        again = run_eval(
            bank / "test.parquet", replayed.url, agent, tmp_path / "again", concurrency=2, progress=False
        )
        with httpx.Client(base_url=replayed.url) as client:
            patient = next(read(live / FILENAME))["patient_id"]
            reply = client.post(
                "/v1/tools/get_organ_volume",
                json={
                    "episode_id": "unrecorded",
                    "patient_id": patient,
                    "arguments": {"organ": "left_adrenal_gland", "visit": "follow_up"},
                },
            ).json()
            assert reply["ok"] is False and reply["error"]["code"] == "not_recorded"
            assert "not recorded" in reply["error"]["message"]
            assert client.get("/readyz").json()["ready"] is True
    assert again["by_data_source"] == first["by_data_source"]
    recorded = {r["id"]: r for r in read(live / FILENAME)}
    for record in read(tmp_path / "again" / FILENAME):
        original = recorded[record["id"]]
        assert record["reward"] == original["reward"]
        assert [m["content"] for m in record["messages"]] == [m["content"] for m in original["messages"]]
        for mine, theirs in zip(record["images"], original["images"], strict=True):
            assert (tmp_path / "again" / mine).read_bytes() == (live / theirs).read_bytes()


def test_openai_agent_end_to_end_through_a_chat_server(bank, server, tmp_path):
    from case_env.core.bank import load_items
    from case_env.eval.openai_agent import ModelSettings
    from tests.openai_stub import StubModel
    from tests.server_harness import serve_app

    items = load_items(bank / "test.parquet")
    stub = StubModel({item.prompt[1]["content"]: item.extra for item in items})
    with serve_app(stub.app) as chat:
        model = ModelSettings(base_url=f"{chat.url}/v1", model="stub", max_turns=40)
        results = run_eval(
            bank / "test.parquet", server.url, "openai", tmp_path, concurrency=2, progress=False, model=model
        )
    assert results["overall"]["accuracy"] == 1.0 and results["overall"]["n"] == len(items)
    assert stub.malformed_replies >= len(items)  # every conversation recovered from its malformed call
    assert stub.images_seen > 0  # radiologist images reached the model as image parts
    personas_tools = {frozenset(item.extra["tool_selection"]) for item in items}
    assert {frozenset(names) for names in stub.tool_names_offered} == personas_tools
    record = next(r for r in read(tmp_path / FILENAME) if r["images"])
    assert record["messages"][2]["tool_calls"][0]["function"]["arguments"] == "{not json"
    assert all((tmp_path / relative).is_file() for relative in record["images"])
    # a chat transcript replays too: images come back from the user message that followed each tool reply
    with (
        live_server(tmp_path / "no-data", tmp_path / "replay", replay_dir=tmp_path) as replayed,
        serve_app(stub.app) as chat,
    ):
        model = ModelSettings(base_url=f"{chat.url}/v1", model="stub", max_turns=40)
        again = run_eval(
            bank / "test.parquet",
            replayed.url,
            "openai",
            tmp_path / "again",
            concurrency=2,
            progress=False,
            model=model,
        )
    assert again["by_data_source"] == results["by_data_source"]


def test_report_renders_in_headless_chromium(bank, server, tmp_path):
    from tests.browser import assert_reads_at_a_glance

    run_eval(bank / "test.parquet", server.url, "vision", tmp_path, concurrency=2, progress=False)
    seen = assert_reads_at_a_glance(tmp_path / "report.html", tmp_path)
    assert seen["images-ok"] >= 3  # two plots and at least one inline tool image
    assert seen["table-rows"] == 3  # one row per persona
    assert seen["plots"] == 2


def test_replay_reads_calls_a_model_wrote_in_its_text(tmp_path):
    """A model served without a tool parser (transformers serve) writes its calls in its text and gets their
    answers in one user turn of `<tool_response>` blocks: the replay book keys those answers as it keys chat
    tool calls, so such a run replays."""
    from case_env.core import registry
    from case_env.core.tools import canonical_arguments
    from case_env.server.replay import ReplayBook

    tools = registry.get("imaging").tools
    calls = '<tool_call>\n{"name": "list_visits", "arguments": {}}\n</tool_call>\n'
    calls += (
        '<tool_call>\n{"name": "get_organ_volume", "arguments": {"organ": "liver", "visit": "baseline"}}\n'
    )
    calls += "</tool_call>"
    answers = (
        "<tool_response>\n2 visit(s).\n</tool_response>\n<tool_response>\nLiver: 1,500 mL.\n</tool_response>"
    )
    record = {
        "patient_id": "sub-0001",
        "env": "imaging",
        "messages": [
            {"role": "user", "content": "Question"},
            {"role": "assistant", "content": calls},
            {"role": "user", "content": answers},
            {"role": "assistant", "content": "<answer>A</answer>"},
        ],
    }
    (tmp_path / "trajectories.jsonl").write_text(json.dumps(record) + "\n")
    book = ReplayBook.load(tmp_path, tools)
    volume = canonical_arguments(tools["get_organ_volume"].parse({"organ": "liver", "visit": "baseline"}))
    visits = canonical_arguments(tools["list_visits"].parse({}))
    assert book.entries[("sub-0001", "get_organ_volume", volume)].text == "Liver: 1,500 mL."
    assert book.entries[("sub-0001", "list_visits", visits)].text == "2 visit(s)."
    assert len(book.entries) == 2


def test_a_model_server_that_times_out_ends_the_run_in_one_line_naming_the_fix(bank, server, tmp_path):
    import asyncio
    import subprocess
    import sys

    from fastapi import FastAPI

    from tests.server_harness import serve_app

    slow = FastAPI()

    @slow.post("/v1/chat/completions")
    async def never_in_time() -> dict:
        await asyncio.sleep(5)
        return {}

    with serve_app(slow) as chat:
        command = [sys.executable, "-m", "case_env.cli", "eval", "--bank", str(bank / "test.parquet")]
        command += ["--server", server.url, "--agent", "openai", "--model-url", f"{chat.url}/v1"]
        command += ["--model", "m", "--out", str(tmp_path / "run"), "--limit", "1", "--call-timeout", "1"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"error: the model server {chat.url}/v1 failed: Request timed out." in done.stderr
    assert "run again with --resume and a larger --call-timeout" in done.stderr


def test_eval_names_an_unreachable_tool_or_model_server_and_writes_nothing(bank, server, tmp_path):
    import subprocess
    import sys

    def eval_(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "case_env.cli", "eval", "--bank", str(bank / "test.parquet"), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    out = tmp_path / "out"
    nowhere = "http://127.0.0.1:9"
    result = eval_("--server", nowhere, "--agent", "random", "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"no tool server answers at {nowhere}" in result.stderr and "case-env serve" in result.stderr
    model = ("--model-url", f"{nowhere}/v1", "--model", "m")
    result = eval_("--server", server.url, "--agent", "openai", *model, "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"no model server answers at {nowhere}/v1" in result.stderr and "--model-url" in result.stderr
    assert not out.exists()
