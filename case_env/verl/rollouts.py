"""Rollouts through verl's real agent loops, scored by verl's reward manager: of a scripted policy, or of a
language model generating on this machine.

This is the main job of `make demo` on a machine without GPUs: the same tool YAML, dataset class, adapter
and reward function a GRPO run uses, with the model replaced by the row's environment's scripted baseline
(`Evaluation.loop_agent`), writing its tool calls in the loop's format (`hermes` or `qwen3_coder`), so every
part between the dataset row and the reward is exercised for real. With a model (`--model`), its own tokens
go through the same loops (`local_model.LocalServer`), and the report says what it wrote: turns whose call
verl's parser reads, calls the server accepted, tokens per turn, and the environment's floors
(`Evaluation.floors`) played on the same rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
from omegaconf import OmegaConf
from verl.tools.tool_registry import load_all_tools

from case_env.core import registry
from case_env.core.bank import Item
from case_env.core.calls import FIELD
from case_env.core.parts import Variant, dialogue_of, evaluation_of
from case_env.core.policy import LoopPolicy
from case_env.verl.config import path_for, write
from case_env.verl.dataset import CaseRLHFDataset
from case_env.verl.local_model import CALLER
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
    calls_ok: int = 0
    crashes: int = 0  # rows whose loop raised (each one a defect)
    turns: int = 0  # assistant turns generated (model runs)
    call_turns: int = 0  # turns in which verl's parser read a call
    misparsed: int = 0  # turns that wrote a call marker verl's parser could not read
    tokens: int = 0  # tokens the model generated
    floors: dict[str, float] = field(default_factory=dict)  # accuracy of the floors on the same rows


@dataclass
class Played:
    """A row's rollout: verl's output (None when the loop raised), its error, and the reward."""

    item: dict
    output: Any
    error: str = ""
    score: dict = field(default_factory=dict)
    model: Any = None


@contextlib.contextmanager
def _quiet():
    """verl prints every tool schema on construction and the dataset prints progress: not for a demo table."""
    import datasets

    datasets.disable_progress_bars()
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def load_rows(parquet: Path, per_source: int, tokenizer: Any = None) -> list[dict]:
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 16384,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "truncation": "error",
        }
    )
    datasets.disable_progress_bars()  # a bar per split read, on every run: noise in a command's output
    with contextlib.redirect_stdout(io.StringIO()):  # verl prints `dataset len: N` on construction
        data = CaseRLHFDataset(
            data_files=[str(parquet)], tokenizer=tokenizer or build_tokenizer(), config=config, processor=None
        )
    chosen: dict[str, list] = defaultdict(list)
    for i in range(len(data)):
        item = data[i]
        if len(chosen[item["data_source"]]) < per_source:
            chosen[item["data_source"]].append(item)
    return [item for source in sorted(chosen) for item in chosen[source]]


def policy_for(
    item: dict, form: str = "hermes", agent: str | None = None, bank: Path = Path(".")
) -> LoopPolicy:
    """A scripted baseline of the row's environment (`agent`, else its `loop_agent`; one that reads its bank
    reads `bank`) as the scripted model's turns."""
    env = registry.for_row(item["data_source"], item["extra_info"])
    row = Item(
        "",
        item["data_source"],
        list(item["raw_prompt"]),
        item["reward_model"]["ground_truth"],
        item["extra_info"],
    )
    evaluation = evaluation_of(env)
    if not (agent or evaluation.loop_agent):
        raise ValueError(f"the {env.name} environment has no scripted baseline to play through verl")
    policy = evaluation.policy_factory(agent or evaluation.loop_agent, bank, 0)(row, Variant(), 0)
    return LoopPolicy(policy, form, listener_of(item))


def listener_of(item: dict) -> tuple[str, str] | None:
    """(tool, argument) that answers plain text in the row's agent loop, when that loop is a dialogue."""
    rules = dialogue_of(registry.for_row(item["data_source"], item["extra_info"]), item.get("agent_name"))
    return (rules.listener, rules.said) if rules is not None else None


async def play(
    items: list[dict], tools: list, concurrency: int, form: str = "hermes", policy=None, model=None
) -> tuple[list, list, list[dict]]:
    """Each row played through its agent loop, then scored by verl's reward manager: (outputs, the models
    that generated them, reward-manager results). The model is `model` (a `LocalServer`, shared by every
    row), else a scripted model per row playing `policy(item)` or the environment's scripted baseline.
    Must run inside an event loop."""
    played = await play_rows(items, tools, concurrency, form, policy, model)
    for row in played:
        if row.error:
            raise RuntimeError(row.error)
    return [r.output for r in played], [r.model for r in played], [r.score for r in played]


async def play_rows(
    items: list[dict],
    tools: list,
    concurrency: int,
    form: str = "hermes",
    policy=None,
    model=None,
    config: Any = None,
    sampling: dict | None = None,
) -> list[Played]:
    """`play`, keeping each row's failure (a loop that raised) beside the others' results. `config` is the
    loop's (offline.loop_config), `sampling` the parameters verl's worker would pass."""
    gate = asyncio.Semaphore(concurrency)
    processor = None if model is not None else build_processor(build_tokenizer())
    config = config if config is not None else loop_config(max_turns=40, form=form)

    async def one(index: int, item: dict) -> Played:
        async with gate:
            CALLER.set(index)
            if model is not None:
                generator = model
            else:
                turns_of = (
                    LoopPolicy(policy(item), form, listener_of(item)) if policy else policy_for(item, form)
                )
                generator = ScriptedModel(build_tokenizer(), turns_of)
            agent = str(item.get("agent_name") or "tool_agent")
            loop = make_loop(tools, generator, processor, config, agent)
            try:
                out = await run_row(loop, item, sampling)
            except Exception as exc:  # a crash of the loop on what the model wrote: reported, not fatal
                done = Played(item, None, f"{type(exc).__name__}: {exc}")
            else:
                done = Played(item, out)
            done.model = generator
            return done

    played = await asyncio.gather(*[one(i, item) for i, item in enumerate(items)])
    finished = [p for p in played if p.output is not None]
    tokenizer = model.tokenizer if model is not None else build_tokenizer()
    scores = await score_with_verl(tokenizer, [p.output for p in finished], [p.item for p in finished])
    for p, score in zip(finished, scores, strict=True):
        p.score = score
    return played


def tool_config(env: str, folder: Path) -> Path:
    """The environment's tool YAML, written afresh (the checked-in copies are kept equal by a test)."""
    return write(registry.get(env), path_for(env, folder))


def load_tools(env: str) -> list:
    with tempfile.TemporaryDirectory(prefix="case-env-tools-") as folder, _quiet():
        return load_all_tools(tool_config_path=str(tool_config(env, Path(folder))), function_tool_path=None)


def bank_env(items: list[dict], parquet: Path) -> str:
    envs = {registry.for_row(i["data_source"], i["extra_info"]).name for i in items}
    if len(envs) != 1:
        raise ValueError(
            f"{parquet} holds rows of {len(envs)} environments ({', '.join(sorted(envs))}); one is needed"
        )
    return envs.pop()


def run_rollouts(
    parquet: Path, server_url: str, per_source: int, concurrency: int, form: str = "hermes"
) -> dict[str, SourceSummary]:
    """The environment's scripted baseline over the first `per_source` rows of each data source."""
    os.environ["CASE_ENV_URL"] = server_url
    items = load_rows(parquet, per_source)
    tools = load_tools(bank_env(items, parquet))
    played = asyncio.run(play_rows(items, tools, concurrency, form))
    return summarise(played)


def summarise(played: list[Played], parsed: dict[str, tuple[int, int, int, int]] | None = None):
    """Per data source: rewards, calls and failures; `parsed` adds a model's turns by request id."""
    summary: dict[str, SourceSummary] = defaultdict(SourceSummary)
    for p in played:
        s = summary[p.item["data_source"]]
        s.n += 1
        if p.output is None:
            s.crashes += 1
            continue
        calls = p.output.extra_fields.get(FIELD, [])
        extra = p.score["reward_extra_info"]
        s.reward += p.score["reward_score"]
        s.correct += float(extra["acc"])
        s.format_ok += bool(extra["format_ok"])
        s.tool_calls += len(calls)
        s.calls_ok += sum(c["status"] == "ok" for c in calls)
        s.infra_errors += sum(bool(c["infra_error"]) for c in calls)
    return dict(summary)
