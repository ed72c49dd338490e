"""The reward entry point verl is configured with (`reward.custom_reward_function.path` = this file).

One function serves verl, the server (`POST /v1/score`) and eval: it routes the row to its environment
(`extra_info.env`, else the environment claiming its data source) and returns that environment's reward as
a flat dict, the common keys `score, acc, pred, format_ok` first. Every row of one environment gets the
same keys, as verl's reward manager requires; one verl batch should hold rows of one environment.
"""

from __future__ import annotations

from typing import Any

from case_env.core import registry


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    env = registry.for_row(data_source, extra_info)
    return env.score(
        solution_str or "", ground_truth, extra_info if isinstance(extra_info, dict) else None
    ).flat()
