"""The question bank: CASE schema, balance and tells, splits, validation of good and broken files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from case_env.core import registry
from case_env.core.bank import ARROW_SCHEMA
from case_env.core.validate import validate
from case_env.envs.imaging.bank.build import build
from case_env.envs.imaging.data.store import PatientStore


@pytest.fixture(scope="module")
def bank(dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bank")
    result = run("bank", "build", "--data-root", str(dataset), "--out", str(out), "--seed", "5")
    assert result.returncode == 0, result.stderr
    assert "vista3d_opsd" in result.stdout and "total" in result.stdout
    return out


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "case_env.cli", *args], capture_output=True, text=True, timeout=600
    )


def rows(bank: Path) -> list[dict]:
    out = []
    for split in ("train", "val", "test"):
        for row in pq.read_table(bank / f"{split}.parquet").to_pylist():
            row["extra"] = json.loads(row["extra_info"])
            out.append(row)
    return out


def test_rows_follow_the_case_schema(bank):
    all_rows = rows(bank)
    assert len(all_rows) >= 70  # about ten per patient over ten patients
    tools = set(registry.get("imaging").tools)
    for row in all_rows:
        extra = row["extra"]
        assert row["agent_name"] == "tool_agent" and row["ability"] == "longitudinal_mri_mcq"
        assert row["reward_model"] == {"style": "rule", "ground_truth": extra["ground_truth"]}
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        user = row["prompt"][1]["content"]
        assert extra["question"] in user and "<answer>X</answer>" in user
        assert all(f"{k}) {v}" in user for k, v in extra["options"].items())
        assert set(extra["tools_kwargs"]) == tools
        assert all(
            v == {"create_kwargs": {"patient_id": extra["patient_id"]}}
            for v in extra["tools_kwargs"].values()
        )
        assert extra["evidence"] and all(e["tool"] in extra["tool_selection"] for e in extra["evidence"])
        assert extra["teacher_insight"]
        assert extra["patient_id"] not in user and extra["patient_id"] not in row["prompt"][0]["content"]
    assert {r["data_source"] for r in all_rows} == {"vista3d_opsd", "medpanel_v2_opsd", "medboard_opsd"}


def test_patients_never_cross_splits_and_lists_are_shipped(bank):
    listed = {s: (bank / f"{s}_patients.txt").read_text().split() for s in ("train", "val", "test")}
    assert not set(listed["train"]) & set(listed["val"]) and not set(listed["train"]) & set(listed["test"])
    assert not set(listed["val"]) & set(listed["test"]) and all(listed.values())
    for split, patients in listed.items():
        seen = {
            json.loads(r["extra_info"])["patient_id"]
            for r in pq.read_table(bank / f"{split}.parquet").to_pylist()
        }
        assert seen == set(patients)
    summary = json.loads((bank / "bank.json").read_text())
    assert summary["patients"] == {s: len(p) for s, p in listed.items()}


def test_correct_letters_are_balanced(bank):
    all_rows = rows(bank)
    for source in ("vista3d_opsd", "medpanel_v2_opsd", "medboard_opsd"):
        letters = Counter(r["reward_model"]["ground_truth"] for r in all_rows if r["data_source"] == source)
        assert max(letters.values()) - min(letters.values()) <= 1, (source, letters)
    letters = Counter(r["reward_model"]["ground_truth"] for r in all_rows)
    shares = [n / len(all_rows) for n in letters.values()]
    assert set(letters) == set("ABCD") and max(shares) - min(shares) <= 0.05


def test_no_option_length_or_middle_value_tell(bank):
    all_rows = rows(bank)
    longest = sum(
        max(r["extra"]["options"].values(), key=len) == r["extra"]["options"][r["extra"]["ground_truth"]]
        and len({len(v) for v in r["extra"]["options"].values()}) > 1
        for r in all_rows
    )
    assert longest / len(all_rows) <= 0.25 + 0.1
    ranks = []
    for r in all_rows:
        values = {
            k: float(re.sub(r"[^\d.]", "", v))
            for k, v in r["extra"]["options"].items()
            if re.fullmatch(r"[\d,.]+ (mL|%)", v)
        }
        if len(values) == 4:
            ordered = sorted(values, key=values.get)
            ranks.append(ordered.index(r["extra"]["ground_truth"]))
    assert len(ranks) >= 25
    middle = sum(rank in (1, 2) for rank in ranks) / len(ranks)
    assert 0.3 <= middle <= 0.7, (middle, Counter(ranks))


def test_answers_are_not_in_the_prompt(bank):
    for row in rows(bank):
        extra = row["extra"]
        correct = extra["options"][extra["ground_truth"]]
        text = row["prompt"][1]["content"].replace(f"{extra['ground_truth']}) {correct}", "")
        assert correct not in text  # the correct option appears only as an option


def test_the_bank_is_deterministic(dataset, tmp_path):
    store = PatientStore(dataset)
    a, b = build(store, 9, (0.8, 0.1, 0.1)), build(store, 9, (0.8, 0.1, 0.1))
    assert a.rows == b.rows
    assert build(store, 10, (0.8, 0.1, 0.1)).rows != a.rows


def test_validate_passes_on_built_banks(bank):
    result = run("bank", "validate", *(str(bank / f"{s}.parquet") for s in ("train", "val", "test")))
    assert result.returncode == 0, result.stderr
    assert "vista3d_opsd" in result.stdout
    assert re.search(r"train\.parquet: \d+ rows, \d+ cases \(", result.stdout), result.stdout


def _damaged(bank: Path, tmp_path: Path, change) -> Path:
    table = pq.read_table(bank / "train.parquet").to_pylist()
    change(table)
    path = tmp_path / "broken.parquet"
    pq.write_table(pa.Table.from_pylist(table, schema=ARROW_SCHEMA), path)
    return path


def _edit_extra(i: int, edit):
    def change(table):
        extra = json.loads(table[i]["extra_info"])
        edit(extra)
        table[i]["extra_info"] = json.dumps(extra)

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t[3].__setitem__("extra_info", "{not json"), "row 3: extra_info is not valid JSON"),
        (
            lambda t: t[4]["reward_model"].__setitem__("ground_truth", "E"),
            "row 4: ground truth 'E' is not one of the options",
        ),
        (
            _edit_extra(5, lambda e: e["tools_kwargs"].pop("read_report")),
            "row 5: tools_kwargs lacks tool key(s) read_report",
        ),
        (_edit_extra(6, lambda e: e.pop("evidence")), "row 6: extra_info lacks evidence"),
        (
            _edit_extra(7, lambda e: e["tools_kwargs"]["list_visits"].__setitem__("create_kwargs", {})),
            "row 7: tools_kwargs entries without create_kwargs.patient_id: list_visits",
        ),
    ],
)
def test_validate_reports_broken_rows(bank, tmp_path, change, message):
    path = _damaged(bank, tmp_path, change)
    result = run("bank", "validate", str(path))
    assert result.returncode == 1
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
    assert any(message in line for line in problems), result.stderr
    assert len(problems) == 1  # one message per broken row, nothing about the intact ones


def test_validate_reports_a_missing_column(bank, tmp_path):
    table = pq.read_table(bank / "train.parquet").drop(["agent_name"])
    path = tmp_path / "no_agent.parquet"
    pq.write_table(table, path)
    report = validate(path)
    assert report.problems == ["missing column(s): agent_name"]
    assert run("bank", "validate", str(path)).returncode == 1


def test_validate_accepts_struct_extra_info(bank, tmp_path):
    rows_ = pq.read_table(bank / "val.parquet").to_pylist()
    for row in rows_:
        row["extra_info"] = json.loads(row["extra_info"])
    path = tmp_path / "struct.parquet"
    pq.write_table(pa.Table.from_pylist(rows_), path)
    assert validate(path).ok


def test_a_question_without_distractors_is_skipped_and_counted(dataset, monkeypatch, tmp_path):
    import functools

    from case_env.core.bank import write
    from case_env.envs.imaging.bank import build as builder
    from case_env.envs.imaging.bank.drafts import DistractorError

    first = builder.TEMPLATES[0]

    @functools.wraps(first)
    def crowded(f, d, ctx):
        if f.patient_id == "case0001":
            raise DistractorError("truth 1235.3")
        return first(f, d, ctx)

    monkeypatch.setattr(builder, "TEMPLATES", (crowded, *builder.TEMPLATES[1:]))
    result = builder.build(PatientStore(dataset), 4, (0.8, 0.1, 0.1))
    line = f"case0001 {first.__name__}: no separated distractors: truth 1235.3"
    assert [s for s in result.skipped if s.startswith(f"case0001 {first.__name__}")] == [line]
    assert result.skipped_by_template[first.__name__] == {"no separated distractors": 1}
    questions = [json.loads(r["extra_info"]) for rows in result.rows.values() for r in rows]
    assert questions and not any(
        q["patient_id"] == "case0001" and q["template"] == first.__name__ for q in questions
    )
    write(result, tmp_path, {})
    summary = json.loads((tmp_path / "bank.json").read_text())
    assert summary["skipped"] == result.skipped and line in summary["skipped"]
    assert summary["skipped_by_template"] == result.skipped_by_template


def test_a_problem_list_cut_short_says_how_many_more():
    from case_env.core.problems import Problems

    problems = Problems(f"row {i}: bad" for i in range(25))
    assert problems.shown(20, "bank.json")[-1] == "... and 5 more (all 25 in bank.json)"
    assert len(problems.shown(20)) == 21 and Problems(["one"]).shown() == ["one"]
