"""Rollouts of the scripted policy through verl's real ToolAgentLoop, scored by verl's reward manager.

This is the main job of `make demo` on a machine without GPUs: the same tool YAML, dataset class, adapter
and reward function a GRPO run uses, with the model replaced by the model-free agents of
`case_env.agents` (the scripted clinician of `case_env.clinic.agents` on a clinic bank), so every part
between the dataset row and the reward is exercised for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf
from verl.tools.tool_registry import load_all_tools

from case_env.agents import scripted_agent
from case_env.agents.base import LoopPolicy
from case_env.verl.config import DEFAULT_PATH
from case_env.verl.dataset import CaseRLHFDataset
from case_env.verl.offline import (
    ScriptedModel,
    build_processor,
    build_tokenizer,
    loop_config,
    make_loop,
    score_with_verl,
)


@dataclass
class SourceSummary:
    n: int = 0
    reward: float = 0.0
    correct: float = (
        0.0  # the reward's `acc`: equal to the reward on imaging banks, strict accuracy in clinic
    )
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
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 16384, "filter_overlong_prompts": False,
                               "return_raw_chat": True, "truncation": "error"})  # fmt: skip
    data = CaseRLHFDataset(
        data_files=[str(parquet)], tokenizer=build_tokenizer(), config=config, processor=None
    )
    chosen: dict[str, list] = defaultdict(list)
    for i in range(len(data)):
        item = data[i]
        if len(chosen[item["data_source"]]) < per_source:
            chosen[item["data_source"]].append(item)
    return [item for source in sorted(chosen) for item in chosen[source]]


def policy_for(item: dict):
    """The model-free policy that plays a row: the scripted clinician on clinic rows, the sequential reader on
    case-reasoning rows (sequential banks: the offline loop is verl's tool_agent)."""
    if item["data_source"] == "casereason":
        from case_env.casereason.agents import Reader, SequentialReader

        reader = Reader(item["extra_info"]["patient_id"], item["raw_prompt"][-1]["content"])
        return SequentialReader(reader, int(item["extra_info"]["casereason"]["attempts"]))
    if item["data_source"].startswith("clinic_"):
        from case_env.clinic.agents import Clinician, ClinicLoopPolicy

        return ClinicLoopPolicy(Clinician("\n".join(m["content"] for m in item["raw_prompt"])))
    return LoopPolicy(scripted_agent(item["extra_info"]))


async def play(
    items: list[dict], tools: list, concurrency: int
) -> tuple[list, list[ScriptedModel], list[dict]]:
    """Each row played by its policy through ToolAgentLoop, then scored by verl's reward manager: (outputs,
    the scripted models with the prompts they saw, reward-manager results). Must run inside an event loop."""
    gate = asyncio.Semaphore(concurrency)

    async def one(item: dict):
        async with gate:
            tokenizer = build_tokenizer()
            model = ScriptedModel(tokenizer, policy_for(item))
            loop = make_loop(
                tools, model, processor=build_processor(tokenizer), config=loop_config(max_turns=40)
            )
            out = await loop.run(sampling_params={}, raw_prompt=item["raw_prompt"], tools_kwargs=item["tools_kwargs"],
                                 extra_info=item["extra_info"], index=item["index"])  # fmt: skip
            return out, model

    played = await asyncio.gather(*[one(item) for item in items])
    outputs = [out for out, _ in played]
    return outputs, [model for _, model in played], await score_with_verl(build_tokenizer(), outputs, items)


def run_rollouts(
    parquet: Path, server_url: str, per_source: int, concurrency: int
) -> dict[str, SourceSummary]:
    os.environ["CASE_ENV_URL"] = server_url
    with _quiet():
        tools = load_all_tools(tool_config_path=str(DEFAULT_PATH.resolve()), function_tool_path=None)
    items = load_rows(parquet, per_source)
    outputs, _models, scores = asyncio.run(play(items, tools, concurrency))
    summary: dict[str, SourceSummary] = defaultdict(SourceSummary)
    for out, item, score in zip(outputs, items, scores, strict=True):
        s = summary[item["data_source"]]
        calls = out.extra_fields.get("case_env_tool_calls", [])
        s.n += 1
        s.reward += score["reward_score"]
        s.correct += float(score["reward_extra_info"]["acc"])
        s.format_ok += bool(score["reward_extra_info"]["format_ok"])
        s.tool_calls += len(calls)
        s.infra_errors += sum(bool(c["infra_error"]) for c in calls)
    return dict(summary)
