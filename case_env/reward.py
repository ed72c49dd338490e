"""The reward entry point verl is configured with (`reward.custom_reward_function.path` = this file).

One function serves verl, the server (`POST /v1/score`) and eval: it routes the row to its environment
(`extra_info.env`, else the environment claiming its data source) and returns that environment's reward as
a flat dict, the common keys `score, acc, pred, format_ok` first. Every row of one environment gets the
same keys, as verl's reward manager requires; one verl batch should hold rows of one environment.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from case_env.core import registry
from case_env.core.problems import describe_errors

if TYPE_CHECKING:
    from case_env.core.environment import Environment

# The readers of model text are linear (core/tags.py), so this only bounds what one call may cost: verl's
# 16,384-token response decodes to about 64k characters. A longer text is scored on its end, where the answer
# is read, and the cut is logged.
MAX_SOLUTION_CHARS = 1_000_000
log = logging.getLogger(__name__)


def capped(solution_str: str | None) -> str:
    """The text a reward reads: its last MAX_SOLUTION_CHARS characters, saying so when it cut."""
    text = solution_str or ""
    if len(text) > MAX_SOLUTION_CHARS:
        log.warning(
            "a response of %d characters is scored on its last %d (%d cut from its start)",
            len(text),
            MAX_SOLUTION_CHARS,
            len(text) - MAX_SOLUTION_CHARS,
        )
        return text[-MAX_SOLUTION_CHARS:]
    return text


class RowError(ValueError):
    """A row its environment's reward cannot read (`extra_info` of the wrong shape): the caller's fault."""


def environment_of(data_source: str, extra_info: dict | None) -> Environment:
    """The row's environment, once its `extra_info` passed the rewards' model (`registry.row_extra`; a
    RowError names the path of each problem)."""
    try:
        registry.row_extra().model_validate(extra_info if isinstance(extra_info, dict) else {})
    except ValidationError as exc:
        raise RowError(describe_errors(exc.errors(include_url=False), ("extra_info",))) from None
    return registry.for_row(data_source, extra_info)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    env = environment_of(data_source, extra_info)
    return env.score(
        capped(solution_str), ground_truth, extra_info if isinstance(extra_info, dict) else None
    ).flat()
