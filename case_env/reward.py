"""The reward entry point verl is configured with (`reward.custom_reward_function.path` = this file).

One function serves verl, the server (`POST /v1/score`) and eval: it routes the row to its environment
(`extra_info.env`, else the environment claiming its data source) and returns that environment's reward as
a flat dict, the common keys `score, acc, pred, format_ok` first. Every row of one environment gets the
same keys; verl's V1 trainer takes rows of several environments with different keys (its legacy trainer
does not: a mixed bank is refused there).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from case_env.core import llm, registry
from case_env.core.calls import ScoreExtra, whole_numbers, written_calls
from case_env.core.problems import describe_errors

if TYPE_CHECKING:
    from case_env.core.environment import Environment

# The readers of model text are linear (core/tags.py), so this only bounds what one call may cost: verl's
# 16,384-token response decodes to about 64k characters. A longer text is scored on its end, where the answer
# is read, and the cut is logged.
MAX_SOLUTION_CHARS = 1_000_000
log = logging.getLogger(__name__)


@cache
def score_deadline_s() -> float:
    """CASE_ENV_SCORE_DEADLINE_S (30 s): what scoring one row may take, its judge included."""
    from case_env.settings import ScoreSettings

    return ScoreSettings().score_deadline_s


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


def read_row(data_source: str, extra_info: dict | None) -> tuple[Environment, ScoreExtra]:
    """The row's environment and its `extra_info` as the rewards' model reads it (`registry.row_extra`,
    every environment's `score_extra` at once): the one validation a row gets. A RowError names the path of
    each problem."""
    try:
        extra = registry.row_extra().model_validate(whole_numbers(extra_info or {}))
    except ValidationError as exc:
        raise RowError(describe_errors(exc.errors(include_url=False), ("extra_info",))) from None
    return registry.for_row(data_source, {"env": extra.env}), extra


Scored = Callable[[], Coroutine[Any, Any, dict[str, Any]]]


def scorer(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None
) -> tuple[Environment, Scored]:
    """The row's environment and its reward as a coroutine function of nothing: the row checked and its text
    capped once, its score computed (and its judge awaited) each time it is called. verl, `/v1/score` and
    eval all score through it."""
    env, extra = read_row(data_source, extra_info if isinstance(extra_info, dict) else None)
    text = capped(solution_str)

    async def scored() -> dict[str, Any]:
        return {**(await env.score(text, ground_truth, extra)).flat(), **failures(text, extra)}

    return env, scored


FAILURE_KEYS = ("infra_error", "calls_dropped")  # every environment's reward has them


def failures(text: str, extra: ScoreExtra) -> dict[str, float]:
    """What went wrong for the infrastructure, as numbers verl logs each step: calls the service failed
    (`infra_error`) and calls the model wrote that never ran (`calls_dropped`: past a turn's limit, say)."""
    ran = extra.case_env_tool_calls
    if ran is None:  # a transcript scored on its own: its calls are what it says
        return {"infra_error": 0.0, "calls_dropped": 0.0}
    written = len(written_calls(text))
    return {
        "infra_error": float(sum(c.infra_error for c in ran)),
        "calls_dropped": float(max(0, written - len(ran))),
    }


def score_row(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """The row's reward for a plain caller (eval's report, tests): `compute_score` run to its end."""
    return asyncio.run(compute_score(data_source, solution_str, ground_truth, extra_info))


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """verl's entry point, a coroutine: verl's reward loop awaits it, and it awaits its judge, so a thousand
    rows wait on their judge together without a thread each. Past `CASE_ENV_SCORE_DEADLINE_S` the
    deterministic fallback scores the row, so verl's own timeout, which would give the row other keys than
    its batch's, never fires first (the launcher sets it higher)."""
    _, scored = scorer(data_source, solution_str, ground_truth, extra_info)
    try:
        return await asyncio.wait_for(scored(), score_deadline_s())
    except TimeoutError:
        log.warning("a %s row passed its scoring deadline; scored without its judge", data_source)
        with llm.judge_silenced():
            return {**await scored(), "judge_fallback": 1.0}
