"""Judges at the scale of a verl step (issue 34): the coroutine reward awaited by verl's own rate-limited
reward manager, judge requests sent together through one bounded pool, the launcher choosing that manager
for banks whose rewards ask a judge, and the deterministic fallback past the scoring deadline."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import case_env.reward
from case_env.bench.standin import StandInProcess
from case_env.core import llm
from case_env.core.bank import load_items, write
from case_env.envs.clinic.bank import build
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.reward import KEYS
from case_env.envs.clinic.synth import make_cases
from case_env.reward import FAILURE_KEYS
from case_env.verl.offline import build_tokenizer
from tests.test_clinic_server import env

MEDEXAGENT_REPLY = "gt_count: 1\npred_count: 1\nmatched: 1"


@pytest.fixture(scope="module")
def clinic_bank(tmp_path_factory):
    bank = tmp_path_factory.mktemp("judged") / "bank"
    write(build(make_cases(40, 0), 0, (1.0, 0.0, 0.0), NoiseConfig()), bank, {"env": "clinic"})
    return bank


@pytest.fixture
def judge_at():
    """CASE_ENV_JUDGE_URL pointed at a stand-in, the process's judge made afresh for it."""

    def pointed(standin: StandInProcess, **settings):
        values = {
            "CASE_ENV_JUDGE_URL": standin.url,
            **{f"CASE_ENV_JUDGE_{k}": v for k, v in settings.items()},
        }
        return env(**values)

    llm.default_judge.cache_clear()
    yield pointed
    llm.default_judge.cache_clear()


def _compose(bank, *extra: str, judge_url: str | None = None):
    from case_env.verl import launch, options

    values = {"CASE_ENV_JUDGE_URL": judge_url} if judge_url else {}
    with env(**values):
        args, rest = options.parse(["--model", "m", "--data", str(bank), *extra])
        args.tool_config = launch.bank_tool_config(bank)
        plan = launch.Plan(args, rest, env_vars=launch.forwarded_env(args, args.server_url))
        config = launch.compose(plan.overrides())
    launch.validate(config)
    return config


def test_the_launcher_gives_judged_banks_verls_rate_limited_manager(clinic_bank, dataset, tmp_path):
    from tests.verl_rows import build_bank

    judged = _compose(clinic_bank, judge_url="http://127.0.0.1:9/v1")
    reward = judged.reward
    assert reward.reward_manager.name == "rate_limited"
    # verl's default of 8 reward workers, each its own limiter: 256 judge requests at once in all
    assert (reward.num_workers, reward.max_concurrent) == (8, 32)
    assert reward.timeout == case_env.reward.score_deadline_s() + 30  # ours falls back first
    assert "max_rpm" not in reward and "max_tpm" not in reward
    limited = _compose(
        clinic_bank, "--judge-concurrency", "64", "--judge-rpm", "600", judge_url="http://127.0.0.1:9/v1"
    ).reward
    assert (limited.max_concurrent, limited.max_rpm) == (8, 75)
    # no judge configured, or a reward that asks none: verl's naive manager, as before
    assert _compose(clinic_bank).reward.reward_manager.name == "naive"
    imaging = build_bank(dataset, tmp_path / "imaging")
    assert _compose(imaging, judge_url="http://127.0.0.1:9/v1").reward.reward_manager.name == "naive"
    # CASE's recipes weight the imaging rubric, which asks the judge
    case = _compose(imaging, "--recipe", "case", judge_url="http://127.0.0.1:9/v1")
    assert case.reward.reward_manager.name == "rate_limited"
    assert _compose(
        imaging, "--recipe", "case-abl-rlaif", judge_url="http://x/v1"
    ).reward.reward_manager.name == ("naive")
    assert _compose(
        clinic_bank, "--reward-manager", "naive", judge_url="http://x/v1"
    ).reward.reward_manager.name == ("naive")


def _rows(bank, n: int) -> list:
    items = load_items(bank)[:n]
    assert len(items) == n
    return items


def _data(tokenizer, item, text: str):
    from verl import DataProto

    response = torch.tensor([tokenizer.encode(text)])
    prompt = torch.tensor([tokenizer.encode("prompt")])
    mask = torch.ones(1, prompt.shape[1] + response.shape[1], dtype=torch.long)
    return DataProto.from_dict(
        tensors={"responses": response, "prompts": prompt, "attention_mask": mask},
        non_tensors={
            "data_source": np.array([item.data_source], dtype=object),
            "reward_model": np.array([{"ground_truth": item.ground_truth}], dtype=object),
            "extra_info": np.array([dict(item.extra)], dtype=object),
        },
    )


def test_verls_rate_limited_manager_awaits_the_reward_and_its_judge_requests_go_out_together(
    clinic_bank, judge_at
):
    """32 rows scored by verl's RateLimitedRewardManager with max_concurrent 16 (as the launcher sets it)
    against a judge answering in 0.4 s: 16 judge requests in flight at once, so two rounds, where a plain
    reward in verl's executor or one judge request at a time would need 32; every row the clinic's keys, each
    decided by the judge."""
    from verl.experimental.reward_loop.reward_manager.limited import RateLimitedRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    items = _rows(clinic_bank, 32)
    tokenizer = build_tokenizer()
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {"path": case_env.reward.__file__, "name": "compute_score"},
                "max_concurrent": 16,
                "timeout": 120,
            }
        }
    )
    RateLimitedRewardManager._class_initialized = False  # its limiters are class state, made once per process
    with StandInProcess(latency_ms=400, reply=MEDEXAGENT_REPLY) as judge, judge_at(judge):

        async def scored():
            manager = RateLimitedRewardManager(config, tokenizer, get_custom_reward_fn(config))
            assert manager.is_async_reward_score  # verl awaits our coroutine
            began = time.perf_counter()
            results = await asyncio.gather(
                *(manager.run_single(_data(tokenizer, item, "[DIAGNOSIS: a condition]")) for item in items)
            )
            return results, time.perf_counter() - began

        results, elapsed = asyncio.run(scored())
        seen = judge.stats()
    RateLimitedRewardManager._class_initialized = False
    assert seen["requests"] == 32 and seen["peak_in_flight"] == 16
    for result in results:
        extra = result["reward_extra_info"]
        assert set(extra) == {*KEYS, *FAILURE_KEYS} and extra["judge"] == "judge", (
            extra
        )  # no timeout/error keys
    assert elapsed < 32 * 0.4 / 2, elapsed  # at least twice the speed of one request at a time


def test_the_judge_pool_is_one_per_endpoint_and_bounds_sync_and_async_callers_together(judge_at):
    """Threads (eval, /v1/score) and coroutines (verl) asking the same judge share its one bound."""
    with StandInProcess(latency_ms=300) as judge, judge_at(judge, CONCURRENCY=4):
        client = llm.default_judge()

        async def both():
            threads = [
                asyncio.to_thread(client.complete, [{"role": "user", "content": f"t{n}"}]) for n in range(6)
            ]
            tasks = [client.acomplete([{"role": "user", "content": f"a{n}"}]) for n in range(6)]
            return await asyncio.gather(*threads, *tasks)

        replies = asyncio.run(both())
        assert all(r is not None and r.text == "yes" for r in replies)
        assert judge.stats()["peak_in_flight"] == 4 and judge.stats()["requests"] == 12
        again = client.complete([{"role": "user", "content": "t0"}])
        assert again.cached and judge.stats()["requests"] == 12  # the cache answers before the pool


def test_a_failing_judge_is_retried_then_the_offline_grader_decides(judge_at):
    with StandInProcess(failure_rate=1.0) as judge, judge_at(judge, RETRIES=2):
        verdict = asyncio.run(
            case_env.reward.compute_score(
                "casereason", "<think>x</think><answer>kala-azar</answer>", "visceral leishmaniasis", {}
            )
        )
        assert judge.stats()["requests"] == 3  # one attempt and two retries
    assert verdict["judge"] != "judge" and set(verdict) >= {"score", "acc", "judge"}


def test_past_the_scoring_deadline_the_offline_grader_scores_with_the_same_keys(judge_at, monkeypatch):
    monkeypatch.setattr(case_env.reward, "score_deadline_s", lambda: 0.5)
    with StandInProcess(latency_ms=5000) as judge, judge_at(judge):
        began = time.perf_counter()
        late = asyncio.run(
            case_env.reward.compute_score(
                "casereason", "<think>x</think><answer>GCA</answer>", "giant cell arteritis", {}
            )
        )
        assert time.perf_counter() - began < 4
    llm.default_judge.cache_clear()
    offline = case_env.reward.score_row(
        "casereason", "<think>x</think><answer>GCA</answer>", "giant cell arteritis", {}
    )
    assert set(late) == set(offline) and late["acc"] == 1.0 and late["judge"] == "unavailable"
