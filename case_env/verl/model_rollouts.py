"""`case-env rollouts --model`: a language model on this machine playing a bank's rows through verl's own loops.

The rows run exactly as in training: verl's dataset class, the row's agent loop (`ToolAgentLoop` or the
environment's own), verl's tool parser, `CaseTool` against the live server, verl's reward manager; only the
inference server is `LocalServer` in this process. Besides rewards it reports what the model wrote: each
turn parsed again by verl's parser (a turn with a call marker the parser cannot read is a mis-parse), the
calls the server accepted, tokens per turn, and the environment's floors played on the same rows. A text
model gets its tools' text only (`CASE_ENV_TOOL_IMAGES=false`). `--out` keeps every turn as the model wrote it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from case_env.core import registry
from case_env.core.calls import FIELD
from case_env.core.parts import evaluation_of
from case_env.lm.engine import Engine
from case_env.lm.prepare import resolve
from case_env.verl.local_model import LocalServer
from case_env.verl.offline import loop_config
from case_env.verl.rollouts import (
    Played,
    SourceSummary,
    bank_env,
    load_rows,
    load_tools,
    play_rows,
    policy_for,
    summarise,
)

CALL_MARKERS = {"hermes": "<tool_call>", "qwen3_coder": "<function="}


@dataclass(frozen=True)
class ModelRun:
    """How the model plays: verl's sampling parameters and lengths."""

    model: str
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    response_length: int = 2048
    max_turns: int = 8
    form: str = "hermes"


@dataclass
class Rollouts:
    """A model's rollouts: verl's outputs and rewards, each row's turns as verl's parser reads them, the
    figures per data source."""

    played: list[Played]
    turns: dict[int, list[dict]]
    summary: dict[str, SourceSummary]


def play_model(parquet: Path, per_source: int, concurrency: int, run: ModelRun, engine: Engine) -> Rollouts:
    """The first `per_source` rows of each data source, played by the model through their agent loops."""
    items = load_rows(parquet, per_source, engine.tokenizer)
    with _text_only():  # the model reads text only; verl would raise on an image
        tools = load_tools(bank_env(items, parquet))
    server = LocalServer(engine, prompt_length=16384, response_length=run.response_length)
    config = loop_config(max_turns=run.max_turns, response_length=run.response_length, form=run.form)
    sampling = {"temperature": run.temperature, "top_p": run.top_p, "top_k": -1, "repetition_penalty": 1.0}
    if run.temperature > 0:
        sampling["seed"] = run.seed
    played = asyncio.run(
        play_rows(items, tools, concurrency, run.form, model=server, config=config, sampling=sampling)
    )
    turns = asyncio.run(_parse_turns(server, played, tools, run.form))
    summary = summarise(played)
    for index, p in enumerate(played):
        s = summary[p.item["data_source"]]
        s.turns += len(turns[index])
        s.call_turns += sum(t["calls"] > 0 for t in turns[index])
        s.misparsed += sum(t["misparsed"] for t in turns[index])
        s.tokens += sum(t["tokens"] for t in turns[index])
    return Rollouts(played, turns, summary)


@contextlib.contextmanager
def _text_only():
    """Tools loaded meanwhile leave images out of their answers (`CASE_ENV_TOOL_IMAGES`, read at load)."""
    before = os.environ.get("CASE_ENV_TOOL_IMAGES")
    os.environ["CASE_ENV_TOOL_IMAGES"] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CASE_ENV_TOOL_IMAGES", None)
        else:
            os.environ["CASE_ENV_TOOL_IMAGES"] = before


def run_model_rollouts(
    parquet: Path,
    server_url: str,
    per_source: int,
    concurrency: int,
    run: ModelRun,
    out: Path | None = None,
    engine: Engine | None = None,
) -> dict[str, SourceSummary]:
    """`play_model`, with the environment's floors on the same rows, written to `out`."""
    os.environ["CASE_ENV_URL"] = server_url
    engine = engine or Engine(resolve(run.model), max_batch=concurrency, seed=run.seed)
    done = play_model(parquet, per_source, concurrency, run, engine)
    items = [p.item for p in done.played]
    env = registry.get(bank_env(items, parquet))
    tools = load_tools(env.name)
    for floor, accuracy in _floors(env, items, tools, concurrency, run.form, parquet.parent).items():
        for source, value in accuracy.items():
            done.summary[source].floors[floor] = value
    if out is not None:
        write_rollouts(out, run, done)
    return done.summary


async def _parse_turns(server: LocalServer, played: list[Played], tools: list, form: str) -> dict[int, list]:
    """Each turn the model generated, read again by verl's own parser with the row's tools."""
    from verl.experimental.agent_loop.tool_parser import ToolParser

    parser = ToolParser.get_tool_parser(form, server.tokenizer)
    schemas = [t.tool_schema for t in tools]
    marker = CALL_MARKERS[form]
    result: dict[int, list] = {}
    for index, _p in enumerate(played):
        turns = []
        for turn in server.turns.get(index, []):
            text = server.tokenizer.decode(turn.token_ids, skip_special_tokens=False)
            _content, calls = await parser.extract_tool_calls(turn.token_ids, schemas)
            turns.append(
                {
                    "request_id": turn.request_id,
                    "text": text,
                    "tokens": len(turn.token_ids),
                    "finish": turn.finish,
                    "cached_tokens": turn.cached_tokens,
                    "calls": len(calls),
                    "misparsed": not calls and marker in text,
                }
            )
        result[index] = turns
    return result


def _floors(
    env, items: list[dict], tools: list, concurrency: int, form: str, bank: Path
) -> dict[str, dict[str, float]]:
    """Accuracy of each of the environment's floors on the same rows, through the same loop."""
    floors = evaluation_of(env).floors
    result: dict[str, dict[str, float]] = {}
    for floor in floors:
        played = asyncio.run(
            play_rows(
                items,
                tools,
                concurrency,
                form,
                policy=lambda item, f=floor: policy_for(item, form, f, bank).policy,
            )
        )
        summary = summarise(played)
        result[floor] = {source: s.correct / s.n for source, s in summary.items() if s.n}
    return result


def write_rollouts(out: Path, run: ModelRun, done: Rollouts) -> None:
    """rollouts.json (settings and figures) and turns.jsonl (every row: the model's turns, the calls as they
    ran, the reward, the failure)."""
    from dataclasses import asdict

    out.mkdir(parents=True, exist_ok=True)
    figures = {"run": asdict(run), "sources": {k: asdict(v) for k, v in done.summary.items()}}
    (out / "rollouts.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    with (out / "turns.jsonl").open("w", encoding="utf-8") as f:
        for index, p in enumerate(done.played):
            extra = p.item["extra_info"]
            record = {
                "data_source": p.item["data_source"],
                "case": extra.get("patient_id"),
                "question": extra.get("question"),
                "ground_truth": p.item["reward_model"]["ground_truth"],
                "turns": done.turns[index],
                "calls": p.output.extra_fields.get(FIELD, []) if p.output is not None else [],
                "reward": p.score.get("reward_extra_info", {}),
                "error": p.error,
            }
            f.write(json.dumps(record, default=str) + "\n")
