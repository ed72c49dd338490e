"""MedCaseReasoning's protocol, against what we did not write: the dataset's real train[0] row in every file
layout (Hugging Face's included), the grader on labelled pairs it was not developed on, the harness's answer
extraction, sampling that makes pass@k mean something, reasoning traces a reasoning server returns apart,
and the synthetic set separating a reader of results from one that ignores them."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from case_env.core.bank import load_items, write
from case_env.core.sft_data import write_sft
from case_env.envs.casereason import reward as rewarding
from case_env.envs.casereason.bank import build
from case_env.envs.casereason.baselines import Reader
from case_env.envs.casereason.cases import load_cases
from case_env.envs.casereason.evaluation import pass_at_k, variants
from case_env.envs.casereason.grader import grade
from case_env.envs.casereason.reward import extract_answer
from case_env.envs.casereason.synth import make_reasoning_case
from case_env.medicine.diagnosis import same_condition
from tests import blocking
from tests.chat_stub import ScriptedChat
from tests.server_harness import live_server, serve_app
from tests.test_casereason import case_bank, reader_model
from tests.test_clinic_server import env

casereason_score = blocking(rewarding.casereason_score)

DATA = Path(__file__).parent / "data"
TRAIN0 = json.loads((DATA / "medcasereasoning_train0.json").read_text())["row"]
PAIRS = list(csv.DictReader((DATA / "graded_pairs.csv").open(encoding="utf-8")))


def test_the_real_train0_row_loads_from_every_layout_and_keeps_its_split(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "cases.jsonl").write_text(json.dumps(TRAIN0) + "\n")
    with (tmp_path / "a" / "cases.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, list(TRAIN0))
        writer.writeheader()
        writer.writerow({**TRAIN0, "pmcid": "PMC4863315-csv"})
    pq.write_table(pa.Table.from_pylist([{**TRAIN0, "pmcid": "PMC4863315-pq"}]), tmp_path / "a" / "c.parquet")
    loaded = load_cases([tmp_path / "a"])
    assert not loaded.problems and len(loaded.cases) == 3
    for case in loaded.cases:
        assert case.diagnosis == "Traumatic neuroma" and case.title.startswith("A diffuse traumatic neuroma")
        assert len(case.statements) == 5
        assert case.statements[0].startswith("Infection or inflammation was considered")
        assert case.statements[4].startswith("Neurovascular hamartoma was considered")
        assert case.statements[4].endswith("dominant neural component.\u201d")
        assert case.split == ""  # a file not named after a split
    # the Hugging Face snapshot: data/{train,val,test}-00000-of-00001.parquet with the card's columns
    snapshot = tmp_path / "MedCaseReasoning"
    (snapshot / "data").mkdir(parents=True)
    (snapshot / "README.md").write_text("dataset card")
    for split, n in (("train", 3), ("val", 1), ("test", 2)):
        rows = [{**TRAIN0, "Unnamed: 0": i, "pmcid": f"PMC{split}{i}"} for i in range(n)]
        pq.write_table(pa.Table.from_pylist(rows), snapshot / "data" / f"{split}-00000-of-00001.parquet")
    loaded = load_cases([snapshot])
    assert not loaded.problems
    assert {c.case_id: c.split for c in loaded.cases} == {
        "PMCtrain0": "train",
        "PMCtrain1": "train",
        "PMCtrain2": "train",
        "PMCval0": "val",
        "PMCtest0": "test",
        "PMCtest1": "test",
    }
    write(build(loaded.cases, 0, (0.8, 0.1, 0.1)), tmp_path / "bank", {})
    for split, n in (("train", 3), ("val", 1), ("test", 2)):
        items = load_items(tmp_path / "bank" / f"{split}.parquet")
        assert len(items) == n and all(i.extra["patient_id"].startswith(f"PMC{split}") for i in items)
    row = load_items(tmp_path / "bank" / "train.parquet")[0]
    assert row.ground_truth == "Traumatic neuroma" and TRAIN0["case_prompt"] in row.prompt[-1]["content"]


def _agreement(judged, part: str) -> tuple[float, float]:
    rows = [r for r in PAIRS if r["part"] == part]
    verdicts = [(judged(r["predicted"], r["truth"]), r["correct"] == "1") for r in rows]
    wrong = [v for v, label in verdicts if not label]
    return sum(v == label for v, label in verdicts) / len(rows), sum(wrong) / len(wrong)


def test_the_grader_agrees_with_labelled_pairs_it_was_not_developed_on():
    parts = {r["part"] for r in PAIRS}
    assert parts == {"develop", "measure"} and len(PAIRS) == 221
    assert len({r["specialty"] for r in PAIRS if r["part"] == "measure"}) >= 12
    agree, false_accepts = _agreement(grade, "measure")
    assert agree >= 0.75 and false_accepts <= 0.20
    # the figures in docs/sources.md: 88/106 with the rules alone, 91/106 with ICD-10-CM beside them
    assert (round(agree, 3), round(false_accepts, 3)) == (0.858, 0.0)
    develop, _ = _agreement(grade, "develop")
    assert develop >= 0.95
    # the clinic's matcher on the same measured pairs: far stricter than the labels (0.330 before ICD-10-CM)
    before, before_false = _agreement(same_condition, "measure")
    assert round(before, 3) == 0.434 and before_false == 0.0


@pytest.mark.parametrize(
    ("truth", "predicted", "correct"),
    [
        ("autoimmune thyroiditis", "Hashimoto thyroiditis", True),
        ("infective endocarditis", "Bartonella endocarditis", True),
        ("renal cell carcinoma", "renal oncocytoma", False),
        ("diffuse large B-cell lymphoma", "DLBCL", True),
        ("Traumatic neuroma", "traumatic neuromas", True),
        ("Traumatic neuroma", "mucosal neuroma", False),
        ("tuberculous meningitis", "meningitis due to Mycobacterium tuberculosis", True),
        ("viral meningitis", "bacterial meningitis", False),
        ("Hodgkin lymphoma", "non-Hodgkin lymphoma", False),
        ("sarcoidosis", "sarcoidosis or tuberculosis", False),
        ("glioblastoma", "brain tumour", False),
        ("granulomatosis with polyangiitis", "eosinophilic granulomatosis with polyangiitis", False),
    ],
)
def test_grader_examples(truth, predicted, correct):
    assert grade(predicted, truth) is correct


def test_answer_extraction_reference_for_evaluation_strict_for_training(tmp_path):
    two = "<think>weighing</think>First <answer>gout</answer>, on reflection <answer>pseudogout</answer>"
    assert extract_answer(two, "reference") == ("gout", True)
    assert extract_answer(two, "strict") == ("pseudogout", True)
    untagged = "<think>weighing</think>The most likely diagnosis is gout."
    assert extract_answer(untagged, "reference") == ("The most likely diagnosis is gout.", False)
    assert extract_answer(untagged, "strict") == (None, False)
    trailing = "<think>x</think><answer>gout</answer> Let me also consider septic arthritis."
    assert extract_answer(trailing, "reference") == ("gout", True)
    assert extract_answer(trailing, "strict") == (None, False)
    # a tool output never answers, in either profile
    tool = "x\nuser\n<tool_response>\n<answer>gout</answer>\n</tool_response>\n<think>y</think>"
    assert extract_answer(tool, "reference") == (None, False) and extract_answer(tool, "strict") == (
        None,
        False,
    )
    with pytest.raises(ValueError, match="choose strict or reference"):
        extract_answer(two, "lenient")
    reference = {"casereason": {"extraction": "reference", "statements": []}}
    assert casereason_score("gout", "gout", reference)["acc"] == 1.0  # the whole reply is judged
    assert casereason_score("gout", "gout", {"casereason": {"statements": []}})["acc"] == 0.0  # strict
    # rows train strict and evaluate as the harness reads
    item = load_items(case_bank(tmp_path, 6) / "train.parquet")[0]
    assert item.extra["casereason"]["extraction"] == "strict"
    assert {v.extra["casereason"]["extraction"] for v in variants(item)} == {"reference"}


def _baselines(n: int) -> dict:
    figures = {}
    for name, use_results in (("reader", True), ("symptoms", False)):
        seq, ind = {1: 0, 5: 0}, {1: 0.0, 5: 0.0}
        for i in range(n):
            row = make_reasoning_case(i, 0)
            reader = Reader(row["pmcid"], row["case_prompt"], use_results)
            truth = row["final_diagnosis"]
            first = next((j + 1 for j, c in enumerate(reader.ranking[:10]) if grade(c, truth)), 0)
            correct = sum(grade(reader.candidate(s), truth) for s in range(10))
            for k in seq:
                seq[k] += 0 < first <= k
                ind[k] += pass_at_k(10, correct, k)
        figures[name] = {f"{mode} acc@{k}": v[k] / n for mode, v in (("seq", seq), ("ind", ind)) for k in v}
    return figures


def test_the_synthetic_set_separates_reading_results_from_ignoring_them():
    figures = _baselines(240)
    reader, symptoms = figures["reader"], figures["symptoms"]
    for key in ("seq acc@5", "ind acc@5", "seq acc@1"):
        assert reader[key] >= symptoms[key] + 0.25, (key, reader[key], symptoms[key])
    assert reader["seq acc@5"] >= 0.95 and symptoms["seq acc@5"] <= 0.8


def _run(*args: str) -> subprocess.CompletedProcess:
    cli = shutil.which("case-env") or str(Path(os.sys.executable).parent / "case-env")
    return subprocess.run([cli, *args], capture_output=True, text=True, timeout=600)


def test_openai_agent_keeps_reasoning_content_samples_above_zero_and_records_it(dataset, tmp_path):
    from case_env.eval.openai_agent import ModelSettings
    from case_env.eval.runner import run_eval

    case_bank(tmp_path, 6)
    chat = ScriptedChat(partial(reader_model, apart=True))
    with (
        serve_app(chat.app) as model_server,
        env(CASE_ENV_CASEREASON_CASES=tmp_path / "cases"),
        live_server(dataset, tmp_path / "srv") as server,
    ):
        model = ModelSettings(base_url=f"{model_server.url}/v1", model="stub")
        served = run_eval(tmp_path / "bank", server.url, "openai", tmp_path / "openai", model=model, seed=3)
        scripted = run_eval(tmp_path / "bank", server.url, "reader", tmp_path / "reader")
        # temperature 0 with ten samples per case is refused before any request, unless asked for
        greedy = ModelSettings(base_url=f"{model_server.url}/v1", model="stub", temperature=0.0)
        before = len(chat.requests)
        with pytest.raises(ValueError, match="pass --greedy-samples"):
            run_eval(tmp_path / "bank", server.url, "openai", tmp_path / "greedy", model=greedy)
        assert len(chat.requests) == before
        allowed = run_eval(
            tmp_path / "bank", server.url, "openai", tmp_path / "g2", model=greedy, greedy_samples=True
        )
        assert allowed["sampling"]["sample_temperature"] == 0.0
    # the trace the server returned apart is the model's reasoning: recall and format read it
    assert served["overall"]["recall"] == scripted["overall"]["recall"] > 0.5
    assert served["overall"]["format_error_rate"] == 0.0
    records = [json.loads(line) for line in (tmp_path / "openai" / "trajectories.jsonl").open()]
    finals = [r["messages"][-1] for r in records]
    assert all(m["role"] == "assistant" and "differential" in m["reasoning_content"] for m in finals)
    write_sft(tmp_path / "openai", tmp_path / "sft.parquet", correct_only=False)
    sft = pq.read_table(tmp_path / "sft.parquet").to_pylist()
    assert all(row["messages"][-1]["content"].startswith("<think>\nThe presentation raises") for row in sft)
    # samples at the environment's temperature, each seeded on its own; the sequential episode greedy;
    # reasoning is never sent back
    samples = [r for r in chat.requests[:before] if not r.get("tools")]
    sequential = [r for r in chat.requests[:before] if r.get("tools")]
    assert {r["temperature"] for r in samples} == {0.6} and {r["temperature"] for r in sequential} == {0.0}
    assert len(samples) == 6 * 10
    by_case: dict[str, set] = {}
    for r in samples:
        by_case.setdefault(r["messages"][1]["content"], set()).add(r["seed"])
    assert len(by_case) == 6 and all(len(seeds) == 10 for seeds in by_case.values())
    assert not any("reasoning_content" in m for r in chat.requests for m in r["messages"])
    assert served["sampling"] == {
        "samples_per_row": 10,
        "repeats": 1,
        "seed": 3,
        "sampler": "model",
        "sample_temperature": 0.6,
        "temperature": 0.0,
        "max_tokens": 2048,
        "seeded_requests": True,
    }
    assert json.loads((tmp_path / "openai" / "results.json").read_text())["sampling"] == served["sampling"]
    # the command line refuses greedy samples too, with exit code 2 and the reason
    bank, nowhere = str(tmp_path / "bank"), "http://127.0.0.1:9"
    flags = ["--agent", "openai", "--model-url", f"{nowhere}/v1", "--model", "m", "--temperature", "0"]
    refused = _run("eval", "--bank", bank, "--server", nowhere, *flags, "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "identical" in refused.stderr and "Traceback" not in refused.stderr


def test_eval_resume_repeats_and_seed_on_a_case_reasoning_bank(dataset, tmp_path):
    from case_env.eval.runner import run_eval

    bank = case_bank(tmp_path, 8) / "train.parquet"
    with env(CASE_ENV_CASEREASON_CASES=tmp_path / "cases"), live_server(dataset, tmp_path / "srv") as server:
        full = run_eval(bank, server.url, "symptoms", tmp_path / "full", repeats=2, seed=1, progress=False)
        path = tmp_path / "full" / "trajectories.jsonl"
        lines = path.read_text().splitlines()
        assert len(lines) == 8 * 2 * 11  # cases x repeats x (10 samples + 1 sequential episode)
        assert len({json.loads(line)["id"] for line in lines}) == len(lines)
        path.write_text("\n".join(lines[:50]) + "\n" + lines[50][:30])  # interrupted, a torn last line
        resumed = run_eval(
            bank, server.url, "symptoms", tmp_path / "full", resume=True, repeats=2, seed=1, progress=False
        )
        assert resumed["overall"] == full["overall"] and len(path.read_text().splitlines()) == len(lines)
        with pytest.raises(FileExistsError, match="--resume"):
            run_eval(bank, server.url, "symptoms", tmp_path / "full", progress=False)
        other = run_eval(bank, server.url, "symptoms", tmp_path / "seed2", repeats=2, seed=2, progress=False)
    answers = {
        seed: sorted(
            (r["id"], r["answer"]) for r in map(json.loads, (tmp_path / d / "trajectories.jsonl").open())
        )
        for seed, d in ((1, "full"), (2, "seed2"))
    }
    assert answers[1] != answers[2]  # another seed draws other samples
    assert (
        full["overall"]["sequential"] == other["overall"]["sequential"]
    )  # the ranking does not depend on it
    assert full["overall"]["n"] == 8 and full["sampling"]["repeats"] == 2 and full["sampling"]["seed"] == 1
