"""The reward of a TRL rollout: case-env's reward for the row, the function verl is configured with.

verl scores the response as it decodes it (the model's turns and the tool turns between them, special tokens
skipped) with the calls that ran in `extra_info`; TRL's completion ids hold the same turns (its tool loop
appends the template's tool turns), and the environment holds the calls, so the reward reads the same text
and the same calls. Every number of the reward (its components, accuracy, format) and the calls are logged as metrics beside it, and
each rollout (its text, episode, calls and reward) is kept for the run's `rollouts.jsonl`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from case_env.core.calls import FIELD
from case_env.reward import compute_score


def case_env_reward(tokenizer: Any, rollouts: Path | None = None):
    """A TRL reward function (async: TRL awaits it on its event loop) over the rollouts' environments; each
    rollout scored is appended to the JSON-lines file `rollouts` as its batch is scored."""

    async def case_env(
        prompts: list,
        completions: list,
        completion_ids: list[list[int]],
        environments: list,
        data_source: list[str],
        ground_truth: list[str],
        extra_info: list[str],
        log_metric: Any = None,
        trainer_state: Any = None,
        **_: Any,
    ) -> list[float]:
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        scored = await asyncio.gather(
            *[
                compute_score(
                    source, text, truth, {**json.loads(extra), FIELD: [c.record() for c in env.calls]}
                )
                for source, text, truth, extra, env in zip(
                    data_source, texts, ground_truth, extra_info, environments, strict=True
                )
            ]
        )
        if rollouts is not None:
            step = trainer_state.global_step if trainer_state is not None else None
            batch = zip(data_source, texts, ground_truth, extra_info, environments, scored, strict=True)
            with rollouts.open("a", encoding="utf-8") as f:
                f.writelines(json.dumps(_rollout(step, *args), default=str) + "\n" for args in batch)
        if log_metric is not None:
            for name, value in metrics(scored, environments).items():
                log_metric(name, value)
        return [float(s["score"]) for s in scored]

    return case_env


def _rollout(step: int | None, source: str, text: str, truth: str, extra: str, env: Any, score: dict) -> dict:
    return {
        "step": step,
        "episode_id": env.episode_id,
        "data_source": source,
        "ground_truth": truth,
        "extra_info": json.loads(extra),
        "text": text,
        "calls": [c.record() for c in env.calls],
        "reward": score,
    }


def metrics(scored: list[dict], environments: list) -> dict[str, float]:
    """Means over a batch's rollouts: every number of the reward (its components, accuracy, format, the
    infrastructure's counts), as verl logs them each step, and the calls made and accepted."""
    n = max(len(scored), 1)
    calls = [c for env in environments for c in env.calls]
    numbers = [k for k, v in (scored[0] if scored else {}).items() if isinstance(v, int | float)]
    return {
        **{f"case_env/{k}": sum(float(s.get(k) or 0.0) for s in scored) / n for k in numbers},
        "case_env/tool_calls": len(calls) / n,
        "case_env/calls_ok": sum(c.ok for c in calls) / n,
    }
