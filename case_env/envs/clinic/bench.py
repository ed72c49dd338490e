"""The clinic's benchmark: MedExAgent-shaped episodes (questions to the patient between exam orders, each call
with the row's noise; the server builds the history from its log) and the server benchmark's cases,
stand-in replies and reward rows."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from case_env.core.parts import ServerBench

QUESTIONS = (
    "Hello, what brings you in today?",
    "When did it start, and has it been getting worse?",
    "Any fever, chills or weight loss?",
    "Do you take any medicines, and any past illnesses?",
    "Does anything make it better or worse?",
)
EXAMS = (
    ("xray", {"region": "chest"}),
    ("cbc", {}),
    ("cmp", {}),
    ("ecg", {}),
    ("ct", {"region": "chest", "contrast": "yes"}),
    ("cardiac_enzyme", {"marker": "troponin"}),
    ("inflammatory_marker", {"marker": "crp"}),
    ("ultrasound", {"region": "abdomen"}),
)
ANSWER = "It started two days ago and it is getting worse."  # the stand-in patient's every reply
STEPS = "aaaeeea"  # MedExAgent's consultation: questions, exams one at a time, a last question


def episode_calls(rng: random.Random) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """One consultation: three questions, three exams, a last question, each call carrying the row's noise
    as the verl adapter sends it."""
    context = {"noise": {"seed": rng.randrange(1000), "patient_rate": 0.3, "exam_rate": 0.1}}
    questions = iter(rng.sample(QUESTIONS, 4))
    calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for step in STEPS:
        if step == "a":
            calls.append(("ask_patient", {"question": next(questions)}, context))
        else:
            exam, arguments = rng.choice(EXAMS)
            calls.append((exam, arguments, context))
    return calls


def exam_calls(rng: random.Random) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Exam orders only (no model on the path): what the server costs around a case's recorded results."""
    noise = {"seed": rng.randrange(1000), "exam_rate": 0.1}
    return [(*rng.choice(EXAMS), {"noise": noise}) for _ in range(7)]


MIXES = {"episode": episode_calls, "exams": exam_calls}
BENCH_CASES = 300  # MedExAgent's clinic acceptance size


def bench_cases(directory: Path) -> dict[str, str]:
    from case_env.envs.clinic.synth import make_cases, write_csv

    path = directory / "clinic_synthetic.csv"
    write_csv(make_cases(BENCH_CASES, seed=0), path)
    return {"CASE_ENV_CLINIC_CASES": str(path)}


def bench_rewards(n: int) -> list[tuple[str, str, str, dict]]:
    """`n` rows of a clinic bank with a final diagnosis the rules do not match, so each asks the judge."""
    from case_env.core.bank import SPLITS
    from case_env.envs.clinic.bank import build
    from case_env.envs.clinic.noise import NoiseConfig
    from case_env.envs.clinic.synth import make_cases

    built = build(make_cases(BENCH_CASES, seed=0), 0, (1.0, 0.0, 0.0), NoiseConfig())
    rows = [row for split in SPLITS for row in built.rows.get(split, [])]
    response = "I think it is a rare inflammatory condition.\n[DIAGNOSIS: a rare inflammatory condition]"
    return [
        (row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])
        for row in (rows[i % len(rows)] for i in range(n))
    ]


SERVER_BENCH = ServerBench(
    cases=bench_cases,
    model_setting="CASE_ENV_CLINIC_PATIENT_URL",
    concurrency_setting="CASE_ENV_CLINIC_PATIENT_CONCURRENCY",
    model_reply=ANSWER,
    rewards=bench_rewards,
    judge_reply="gt_count: 1\npred_count: 1\nmatched: 1",  # MedExAgent's judge format
    first_call=lambda i: ("ask_patient", {"question": QUESTIONS[0]}),  # every reply a fresh sample
)
