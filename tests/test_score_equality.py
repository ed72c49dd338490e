"""Scores do not change unnoticed: every row of a bank of each environment (the suite's deterministic synthetic
banks), scored for its own answer, a wrong one and none, equals the scores recorded in
`tests/data/scores.json`. A change to a reward that is meant to change scores records them again with
`CASE_ENV_RECORD_SCORES=1` and shows the difference in review."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from case_env.core.bank import load_items, write
from case_env.core.calls import FIELD
from case_env.envs.casereason import bank as reason_bank
from case_env.envs.casereason.cases import read_file
from case_env.envs.casereason.synth import write_cases
from case_env.envs.clinic import bank as clinic_bank
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.synth import make_cases
from case_env.reward import score_row

RECORDED = Path(__file__).parent / "data" / "scores.json"
ANSWERS = {"own": "<answer>{truth}</answer>", "wrong": "<answer>not-a-known-answer</answer>", "none": ""}


@pytest.fixture(scope="module")
def banks(bank, tmp_path_factory) -> dict[str, Path]:
    """The imaging bank of the session, and the clinic and case-reasoning banks the model tests build."""
    tmp = tmp_path_factory.mktemp("scored")
    write(clinic_bank.build(make_cases(24, seed=2), 2, (0.8, 0.1, 0.1), NoiseConfig()), tmp / "clinic", {})
    write_cases(24, 2, tmp / "casereason.jsonl")
    cases = read_file(tmp / "casereason.jsonl").cases
    write(reason_bank.build(cases, 2, (0.8, 0.1, 0.1), "sequential", 3), tmp / "casereason", {})
    return {"imaging": bank, "clinic": tmp / "clinic", "casereason": tmp / "casereason"}


def scores(banks: dict[str, Path]) -> dict[str, dict]:
    out = {}
    for env, folder in banks.items():
        for item in load_items(folder):
            extra = {**item.extra, FIELD: []}
            for name, text in ANSWERS.items():
                score = score_row(
                    item.data_source, text.format(truth=item.ground_truth), item.ground_truth, extra
                )
                out[f"{env}/{item.key}/{name}"] = json.loads(json.dumps(score, default=str))
    return out


def test_every_rows_scores_equal_the_recorded_ones(banks):
    found = scores(banks)
    if os.environ.get("CASE_ENV_RECORD_SCORES") == "1":
        # a score per line, so that a review reads what changed
        lines = (f"{json.dumps(key)}: {json.dumps(found[key], sort_keys=True)}" for key in sorted(found))
        RECORDED.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    recorded = json.loads(RECORDED.read_text())
    assert found.keys() == recorded.keys()
    changed = [key for key in recorded if found[key] != recorded[key]]
    assert not changed, (
        f"{len(changed)} scores changed, first {changed[0]}: {recorded[changed[0]]} -> {found[changed[0]]}"
    )
    # the fixture tells answers apart: an own answer scores above a wrong one somewhere in every environment
    for env in banks:
        assert any(
            found[key]["score"] > found[key.replace("/own", "/wrong")]["score"]
            for key in found
            if key.startswith(f"{env}/") and key.endswith("/own")
        ), env
