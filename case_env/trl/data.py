"""Bank rows and trajectories as TRL's datasets.

GRPO: one row per bank row, its conversational `prompt`, the columns the reward reads (`data_source`,
`ground_truth`, `extra_info` as JSON) and `environment`, the key of the row's tool set (`episode.py`).
TRL runs its own tool loop for every row: a turn without a call ends the episode, where a dialogue loop (an
environment's own loop that answers plain text) would hand its text on; such rows are played through their tools.
SFT: the conversations `case-env traj to-sft` exports (or an eval run's folder), tokenized with the model's
chat template, the loss on the assistant's tokens only, as verl's multi-turn SFT dataset trains them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from case_env.core import registry
from case_env.core.bank import load_items
from case_env.core.environment import Environment, unknown_weights, with_weights
from case_env.trl.episode import CaseEpisode, episode_class


def offered(env: Environment, extra: dict) -> list[str]:
    """The tools a row offers: its `tool_selection`, else all of its environment's."""
    chosen = extra.get("tool_selection") or list(env.tools)
    return [name for name in chosen if name in env.tools]


def grpo_rows(
    bank: Path, limit: int | None = None, weights: dict[str, float] | None = None
) -> tuple[Environment, list[dict], dict[str, tuple[str, ...]]]:
    """(the environment, dataset rows, tool set of each `environment` key) of a bank file, with `weights`
    over each row's own reward weights."""
    items = load_items(bank)[:limit]
    if not items:
        raise ValueError(f"{bank} holds no rows")
    envs = {registry.for_row(i.data_source, i.extra).name for i in items}
    if len(envs) != 1:
        raise ValueError(
            f"{bank} holds rows of {len(envs)} environments ({', '.join(sorted(envs))}); one is needed"
        )
    env = registry.get(envs.pop())
    wrong = unknown_weights(env, weights or {})
    if wrong:
        raise ValueError(f"--reward-weights: {wrong}")
    rows, tool_sets = [], {}
    for item in items:
        tools = tuple(offered(env, item.extra))
        key = f"{env.name}:{'+'.join(tools)}"
        tool_sets[key] = tools
        rows.append(
            {
                "prompt": [{"role": m["role"], "content": m["content"]} for m in item.prompt],
                "environment": key,
                "data_source": item.data_source,
                "ground_truth": item.ground_truth,
                "extra_info": json.dumps(with_weights(item.extra, weights)),
            }
        )
    return env, rows, tool_sets


def factories(
    env: Environment, tool_sets: dict[str, tuple[str, ...]], **options: Any
) -> dict[str, type[CaseEpisode]]:
    return {key: episode_class(env, list(tools), **options) for key, tools in tool_sets.items()}


def sft_examples(conversations: list[dict], tokenizer: Any, max_length: int) -> list[dict]:
    """`input_ids` and `assistant_masks` of each conversation (`messages`, `tools`): an assistant message's
    tokens are those its rendering adds after the generation prompt. Conversations longer than `max_length`
    are left out (cutting one would train on a call whose answer is gone)."""
    out = []
    for conversation in conversations:
        messages = [_chat(m) for m in conversation["messages"]]
        tools = conversation.get("tools") or None
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = len(
                tokenizer.apply_chat_template(
                    messages[:i], tools=tools, tokenize=False, add_generation_prompt=True
                )
            )
            end = len(tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False))
            spans.append((start, end))
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = encoded["input_ids"]
        if len(ids) > max_length:
            continue
        mask = [int(any(a <= first < b for a, b in spans)) for first, _last in encoded["offset_mapping"]]
        out.append({"input_ids": ids, "assistant_masks": mask})
    return out


def _chat(message: dict) -> dict:
    """A message as chat templates take it: tool-call arguments as objects."""
    out = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            function = dict(call["function"])
            if isinstance(function.get("arguments"), str):
                function["arguments"] = json.loads(function["arguments"] or "{}")
            calls.append({"type": "function", "function": function})
        out["tool_calls"] = calls
    return out
