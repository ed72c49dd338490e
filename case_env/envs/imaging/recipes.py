"""CASE's RL stage and its two ablations as training recipes (`case-env train run --recipe case`).

From the model cards (docs/sources.md, CASE): `CASE-8B-RL` is GRPO over multi-turn tool rollouts plus OPSD
(privileged on-policy self-distillation from `teacher_insight`) plus a rubric-judge reward (RLAIF), one epoch
(1,912 steps) from `CASE-8B-RSFT` (Qwen3-VL-8B-Instruct after SFT); `CASE-8B-ABL-OPSD` drops OPSD and
`CASE-8B-ABL-RLAIF` drops the rubric judge. Everything else is ours, because the cards publish nothing more:
the group size and the rest of the base recipe (launch.py), verl's distillation loss settings (k3 over the
student's tokens, coefficient 1, added to GRPO's loss), the rubric's items and its weight (0.5: a fully met
rubric is worth half a correct answer, so the answer stays what the run optimises first).
"""

from __future__ import annotations

from case_env.core.parts import Recipe

RUBRIC_WEIGHT = 0.5  # ours
_RUBRIC = {"rubric": RUBRIC_WEIGHT}
_NO_RUBRIC = {"rubric": 0.0}


def _case(opsd: bool, weights: dict[str, float], summary: str) -> Recipe:
    return Recipe(
        {}, group_size=8, epochs=1, rollout="vllm", summary=summary, opsd=opsd, reward_weights=weights
    )


RECIPES = {
    "case": _case(True, _RUBRIC, "CASE-8B-RL: GRPO + OPSD from teacher_insight + rubric judge, one epoch"),
    "case-abl-opsd": _case(False, _RUBRIC, "CASE-8B-ABL-OPSD: GRPO + rubric judge, without OPSD"),
    "case-abl-rlaif": _case(True, _NO_RUBRIC, "CASE-8B-ABL-RLAIF: GRPO + OPSD, without the rubric judge"),
}
