"""Rollouts of the scripted policy through verl's real ToolAgentLoop, scored by verl's reward manager.

This is the main job of `make demo` on a machine without GPUs: the same tool YAML, dataset class, adapter
and reward function a GRPO run uses, with the model replaced by the row's environment's scripted baseline
(`Baselines.loop_agent`), writing its tool calls in the loop's format (`hermes` or `qwen3_coder`), so every
part between the dataset row and the reward is exercised for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf
from verl.tools.tool_registry import load_all_tools

from case_env.core import registry
from case_env.core.bank import Item
from case_env.core.calls import FIELD
from case_env.core.parts import Baselines, Variant, dialogue_of
from case_env.core.policy import LoopPolicy
from case_env.verl.config import path_for, write
from case_env.verl.dataset import CaseRLHFDataset
from case_env.verl.offline import (
    ScriptedModel,
    build_processor,
    build_tokenizer,
    loop_config,
    make_loop,
    run_row,
    score_with_verl,
)


@dataclass
class SourceSummary:
    n: int = 0
    reward: float = 0.0
    correct: float = 0.0  # the reward's `acc`
    format_ok: int = 0
    tool_calls: int = 0
    infra_errors: int = 0


@contextlib.contextmanager
def _quiet():
    """verl prints every tool schema on construction and the dataset prints progress: not for a demo table."""
    import datasets

    datasets.disable_progress_bars()
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def load_rows(parquet: Path, per_source: int) -> list[dict]:
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 16384,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "truncation": "error",
        }
    )
    data = CaseRLHFDataset(
        data_files=[str(parquet)], tokenizer=build_tokenizer(), config=config, processor=None
    )
    chosen: dict[str, list] = defaultdict(list)
    for i in range(len(data)):
        item = data[i]
        if len(chosen[item["data_source"]]) < per_source:
            chosen[item["data_source"]].append(item)
    return [item for source in sorted(chosen) for item in chosen[source]]


def policy_for(item: dict, form: str = "hermes") -> LoopPolicy:
    """The row's environment's scripted baseline (`Baselines.loop_agent`), as the scripted model's turns."""
    env = registry.for_row(item["data_source"], item["extra_info"])
    row = Item(
        "",
        item["data_source"],
        list(item["raw_prompt"]),
        item["reward_model"]["ground_truth"],
        item["extra_info"],
    )
    if not isinstance(env, Baselines) or not env.loop_agent:
        raise ValueError(f"the {env.name} environment has no scripted baseline to play through verl")
    policy = env.policy_factory(env.loop_agent, Path("."), 0)(row, Variant(), 0)
    return LoopPolicy(policy, form, listener_of(item))


def listener_of(item: dict) -> tuple[str, str] | None:
    """(tool, argument) that answers plain text in the row's agent loop, when that loop is a dialogue."""
    rules = dialogue_of(registry.for_row(item["data_source"], item["extra_info"]), item.get("agent_name"))
    return (rules.listener, rules.said) if rules is not None else None


async def play(
    items: list[dict], tools: list, concurrency: int, form: str = "hermes", policy=None
) -> tuple[list, list[ScriptedModel], list[dict]]:
    """Each row played by its policy (`policy(item)`, else its environment's scripted baseline) through
    ToolAgentLoop, then scored by verl's reward manager: (outputs, the scripted models with the prompts they
    saw, reward-manager results). Must run inside an event loop."""
    gate = asyncio.Semaphore(concurrency)

    async def one(item: dict):
        async with gate:
            tokenizer = build_tokenizer()
            if policy is not None:
                turns = LoopPolicy(policy(item), form, listener_of(item))
            else:
                turns = policy_for(item, form)
            model = ScriptedModel(tokenizer, turns)
            config = loop_config(max_turns=40, form=form)
            agent = str(item.get("agent_name") or "tool_agent")
            loop = make_loop(tools, model, build_processor(tokenizer), config, agent)
            out = await run_row(loop, item)
            return out, model

    played = await asyncio.gather(*[one(item) for item in items])
    outputs = [out for out, _ in played]
    return outputs, [model for _, model in played], await score_with_verl(build_tokenizer(), outputs, items)


def tool_config(env: str, folder: Path) -> Path:
    """The environment's tool YAML, written afresh (the checked-in copies are kept equal by a test)."""
    return write(registry.get(env), path_for(env, folder))


def run_rollouts(
    parquet: Path, server_url: str, per_source: int, concurrency: int, form: str = "hermes"
) -> dict[str, SourceSummary]:
    os.environ["CASE_ENV_URL"] = server_url
    items = load_rows(parquet, per_source)
    envs = {registry.for_row(i["data_source"], i["extra_info"]).name for i in items}
    if len(envs) != 1:
        raise ValueError(
            f"{parquet} holds rows of {len(envs)} environments ({', '.join(sorted(envs))}); one is needed"
        )
    with tempfile.TemporaryDirectory(prefix="case-env-tools-") as folder, _quiet():
        tools = load_all_tools(
            tool_config_path=str(tool_config(envs.pop(), Path(folder))), function_tool_path=None
        )
    outputs, _models, scores = asyncio.run(play(items, tools, concurrency, form))
    summary: dict[str, SourceSummary] = defaultdict(SourceSummary)
    for out, item, score in zip(outputs, items, scores, strict=True):
        s = summary[item["data_source"]]
        calls = out.extra_fields.get(FIELD, [])
        s.n += 1
        s.reward += score["reward_score"]
        s.correct += float(score["reward_extra_info"]["acc"])
        s.format_ok += bool(score["reward_extra_info"]["format_ok"])
        s.tool_calls += len(calls)
        s.infra_errors += sum(bool(c["infra_error"]) for c in calls)
    return dict(summary)
