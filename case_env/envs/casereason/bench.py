"""Case reasoning's benchmark: sequential episodes (up to three judged `submit_diagnosis` attempts, the server
holding the episode's context) and the server benchmark's cases, stand-in replies and reward rows."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from case_env.core.parts import ServerBench

GUESSES = ("giant cell arteritis", "pulmonary embolism", "sarcoidosis", "pneumothorax", "aortic dissection")
BENCH_CASES = 300


def episode_calls(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """One sequential episode: one to three attempts, each a name the judge has not seen (its verdicts are
    cached, so a repeated name would measure the cache, not the wait on the judge)."""
    tag = rng.randrange(10**9)
    return [
        ("submit_diagnosis", {"diagnosis": f"{guess} type {tag}"})
        for guess in rng.sample(GUESSES, rng.randint(1, 3))
    ]


MIXES = {"episode": episode_calls}


def bench_cases(directory: Path) -> dict[str, str]:
    from case_env.envs.casereason.synth import write_cases

    path = directory / "casereason_synthetic.jsonl"
    write_cases(BENCH_CASES, 0, path)
    return {"CASE_ENV_CASEREASON_CASES": str(path)}


def bench_rewards(n: int) -> list[tuple[str, str, str, dict]]:
    """`n` rows of k=1 with a final answer and a reasoning trace, each asking the judge a question of its own."""
    from case_env.envs.casereason.synth import make_reasoning_case

    rows = []
    extra = {"env": "casereason", "casereason": {"attempts": 1}}
    for i in range(n):  # a distinct answer per row: no row reads another's cached verdict
        case = make_reasoning_case(i % BENCH_CASES, 0)
        answer = f"{GUESSES[i % len(GUESSES)]} type {i}"
        response = (
            f"<think>The presentation and the findings point one way.</think>\n<answer>{answer}</answer>"
        )
        rows.append(("casereason", response, case["final_diagnosis"], dict(extra)))
    return rows


SERVER_BENCH = ServerBench(
    cases=bench_cases,
    model_setting="CASE_ENV_JUDGE_URL",  # submit_diagnosis asks the judge
    concurrency_setting="CASE_ENV_JUDGE_CONCURRENCY",
    model_reply="no",
    rewards=bench_rewards,
    judge_reply="yes",
    first_call=lambda i: ("submit_diagnosis", {"diagnosis": f"{GUESSES[0]} type {i}"}),  # judged afresh
)
