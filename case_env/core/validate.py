"""`case-env bank validate`: check any parquet in the CASE schema, ours or the published CASE-Bench banks.

The common schema is checked here; each row is routed to its environment (`extra_info.env`, else its data
source), which names the keys its rows need and checks what only it understands (options and letters).

Reports one message per broken row (row index and reason) rather than stopping at the first, and counts
per data source and case, so a user can see at once what a bank holds and what is wrong with it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from case_env.core import registry
from case_env.core.bank import AGENT_NAMES, REQUIRED_COLUMNS, REQUIRED_EXTRA, BankError, ExtraInfo, read_bank
from case_env.core.parts import Data, Training


@dataclass
class Validation:
    path: Path
    rows: int = 0
    problems: list[str] = field(default_factory=list)
    by_source: Counter = field(default_factory=Counter)
    by_case: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.problems


def _extra(value) -> tuple[dict | None, str | None]:
    if isinstance(value, dict):
        return value, None
    if not isinstance(value, str):
        return None, f"extra_info must be a JSON string or a struct, not {type(value).__name__}"
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        return None, f"extra_info is not valid JSON ({exc.msg} at character {exc.pos})"
    if not isinstance(parsed, dict):
        return None, "extra_info JSON must be an object"
    return parsed, None


def _check_row(row: dict, tool_names: set[str]) -> list[str]:
    problems = []
    prompt = row.get("prompt")
    reward = row.get("reward_model")
    truth = reward.get("ground_truth") if isinstance(reward, dict) else None
    if not truth:
        problems.append("reward_model.ground_truth is missing")
    extra, error = _extra(row.get("extra_info"))
    env = None
    if extra is not None:
        try:
            env = registry.for_row(str(row.get("data_source", "")), extra)
        except registry.RegistryError as exc:
            error = f"extra_info.env: {exc}"
    # an environment's own agent loop may open with a system message alone (a consultation: the doctor speaks
    # first); verl's stock loops generate an answer to the user's message
    own = env.agent_loops if isinstance(env, Training) else {}
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    ):
        problems.append("prompt must be a non-empty list of {role, content} messages")
    elif prompt[-1].get("role") != "user" and row.get("agent_name") not in own:
        problems.append("the last prompt message must be the user's")
    names = (*AGENT_NAMES, *own)
    if row.get("agent_name") not in (None, *names):
        problems.append(f"agent_name is {row.get('agent_name')!r}, expected {' or '.join(names)}")
    if error or env is None:
        return [*problems, error or "extra_info is missing"]
    required = (*REQUIRED_EXTRA, *(env.required_extra if isinstance(env, Data) else ()))
    missing = [k for k in required if k not in extra]
    if missing:
        problems.append(f"extra_info lacks {', '.join(missing)}")
    else:
        for model in (ExtraInfo, registry.row_extra()):  # the row's fields, then what the rewards read
            try:
                model.model_validate(extra)
            except ValidationError as exc:
                problems += [
                    f"extra_info.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3]
                ]
    if isinstance(env, Data):
        problems += env.check_row(row, extra)
    if (
        truth
        and "ground_truth" in extra
        and str(extra["ground_truth"]).strip().upper() != str(truth).strip().upper()
    ):
        problems.append(
            f"extra_info.ground_truth {extra['ground_truth']!r} differs from reward_model {truth!r}"
        )
    return [*problems, *_check_tools_kwargs(extra, tool_names)]


def _check_tools_kwargs(extra: dict, tool_names: set[str]) -> list[str]:
    """`tools_kwargs` and `tool_selection`: every tool listed, each with the row's patient; the selection
    among them."""
    problems = []
    kwargs = extra.get("tools_kwargs")
    if "tools_kwargs" in extra:
        if not isinstance(kwargs, dict) or not kwargs:
            problems.append("extra_info.tools_kwargs must be a non-empty object")
        else:
            broken = sorted(
                name
                for name, v in kwargs.items()
                if not isinstance(v, dict)
                or not isinstance(v.get("create_kwargs"), dict)
                or not v["create_kwargs"].get("patient_id")
            )
            if broken:
                problems.append(f"tools_kwargs entries without create_kwargs.patient_id: {', '.join(broken)}")
            if absent := sorted(tool_names - set(kwargs)):
                problems.append(
                    f"tools_kwargs lacks tool key(s) {', '.join(absent)} (every row must list every tool)"
                )
            named = {
                v["create_kwargs"].get("patient_id")
                for v in kwargs.values()
                if isinstance(v, dict) and isinstance(v.get("create_kwargs"), dict)
            } - {None}
            if extra.get("patient_id") and named - {extra["patient_id"]}:
                problems.append("tools_kwargs name a case other than extra_info.patient_id")
    selection = extra.get("tool_selection")
    if (
        isinstance(selection, list)
        and isinstance(kwargs, dict)
        and (unknown := sorted(set(selection) - set(kwargs)))
    ):
        problems.append(f"tool_selection names tools without tools_kwargs: {', '.join(unknown)}")
    return problems


def validate(path: Path) -> Validation:
    result = Validation(path)
    try:
        table = read_bank(path)
    except (FileNotFoundError, BankError) as exc:
        result.problems.append(str(exc))
        return result
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        result.problems.append(f"missing column(s): {', '.join(missing)}")
        return result
    rows = table.to_pylist()
    result.rows = len(rows)
    extras = [_extra(row.get("extra_info"))[0] for row in rows]
    # The bank's tool set is every tool any row names; a row lacking one breaks that tool's calls in verl.
    tool_names = {
        name for e in extras if e and isinstance(e.get("tools_kwargs"), dict) for name in e["tools_kwargs"]
    }
    for i, (row, extra) in enumerate(zip(rows, extras, strict=True)):
        reasons = _check_row(row, tool_names)
        if reasons:  # one message per broken row, with every reason
            result.problems.append(f"row {i}: " + "; ".join(reasons))
        result.by_source[row.get("data_source") or "?"] += 1
        result.by_case[(extra or {}).get("patient_id") or "?"] += 1
    return result
