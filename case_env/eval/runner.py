"""Run one agent over a bank against a live server, append each finished item to the trajectory file, and
summarise. The trajectory file is the run's only state: `--resume` skips what it already holds, so an
interrupted run continues without redoing work, and results.json is always recomputed from it."""

from __future__ import annotations

import json
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import httpx
from tqdm import tqdm

from case_env.agents.base import Agent
from case_env.agents.direct import run_episode
from case_env.eval import trajectory
from case_env.eval.bank import Item, load_items, reference_rows
from case_env.eval.baselines import LeavePatientOut, NoToolAgent, RandomAgent
from case_env.eval.openai_agent import ModelSettings, OpenAIAgent
from case_env.eval.report import write_report
from case_env.reward import compute_score

AGENTS = ("openai", "scripted", "vision", "no-tool", "random")

# An agent is made per rollout, from the item, the OpenAI schemas of the row's tools and the repeat index
# (stochastic agents draw differently on each repeat of a question).
AgentFactory = Callable[[Item, list[dict], int], Agent]


def agent_factory(name: str, bank: Path, seed: int = 0, model: ModelSettings | None = None) -> AgentFactory:
    from case_env.agents import scripted_agent
    from case_env.agents.scripted import TextAgent

    if name == "openai":
        if model is None:
            raise ValueError("the openai agent needs --model-url and --model")
        import openai

        client = openai.OpenAI(base_url=model.base_url, api_key=model.api_key, max_retries=2)
        return lambda item, tools, _repeat: OpenAIAgent(item.extra, item.prompt, tools, model, client)
    if name == "scripted":
        return lambda item, _tools, _repeat: TextAgent(item.extra)  # tool text only, also on image questions
    if name == "vision":
        # pixels for image questions; a vision policy reads the text of the others
        return lambda item, _tools, _repeat: scripted_agent(item.extra)
    if name == "random":
        return lambda item, _tools, repeat: RandomAgent(item.extra, seed + repeat)
    if name == "no-tool":
        priors = LeavePatientOut(reference_rows(bank))
        lock = threading.Lock()  # agents are made on pool threads; fit each patient's prior once

        def no_tool(item: Item, _tools: list[dict], repeat: int) -> Agent:
            with lock:
                return NoToolAgent(item.extra, seed + repeat, priors)

        return no_tool
    raise ValueError(f"unknown agent {name!r}; choose one of {', '.join(AGENTS)}")


def summarise(records: list[dict], agent: str, bank: str, server_version: str) -> dict:
    by_source: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_source[record["data_source"]].append(record)

    def accuracy(rows: list[dict]) -> float:
        return round(sum(r["reward"] for r in rows) / len(rows), 4) if rows else 0.0

    questions = {r.get("question_id", r["id"]) for r in records}
    return {
        "overall": {
            "accuracy": accuracy(records),
            "n": len(records),
            "questions": len(questions),
            "repeats": max((r.get("repeat", 0) for r in records), default=0) + 1,
        },
        "by_data_source": {
            source: {
                "accuracy": accuracy(rows),
                "n": len(rows),
                "mean_tool_calls": round(sum(r["tool_calls"] for r in rows) / len(rows), 3),
                "format_error_rate": round(sum(not r["format_ok"] for r in rows) / len(rows), 4),
                "chance": round(sum(1 / r["options"] for r in rows) / len(rows), 4),
            }
            for source, rows in sorted(by_source.items())
        },
        "agent": agent,
        "bank": bank,
        "server_version": server_version,
    }


def run_eval(bank: Path, server_url: str, agent: str, out: Path, concurrency: int = 4, limit: int | None = None,
             resume: bool = False, token: str | None = None, max_calls: int = 32, progress: bool = True,
             model: ModelSettings | None = None, repeats: int = 1, seed: int = 0) -> dict:  # fmt: skip
    """Roll every item of the bank out `repeats` times; accuracy is the mean reward over all rollouts, so a
    stochastic agent's figure is an average over `repeats` draws per question rather than a single draw."""
    make_agent = agent_factory(agent, bank, seed=seed, model=model)
    items = load_items(bank)[:limit] if limit else load_items(bank)
    out.mkdir(parents=True, exist_ok=True)
    path = out / trajectory.FILENAME
    if path.exists() and not resume:
        raise FileExistsError(f"{path} exists: pass --resume to continue that run, or choose another --out")
    trajectory.drop_torn_tail(path)
    done = {record["id"] for record in trajectory.read(path)}
    rollouts = [(item, repeat) for item in items for repeat in range(repeats)]
    todo = [(item, r) for item, r in rollouts if trajectory.rollout_id(item, r) not in done]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=server_url, headers=headers, timeout=60.0) as probe:
        server_version = probe.get("/healthz").raise_for_status().json().get("version", "")
        tools = probe.get("/v1/tools").raise_for_status().json()
    lock = threading.Lock()
    local = threading.local()

    def one(item: Item, repeat: int) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=server_url, headers=headers, timeout=60.0)
        allowed = set(item.extra.get("tool_selection") or [])
        schemas = [t["schema"] for t in tools["tools"] if not allowed or t["name"] in allowed]
        policy = make_agent(item, schemas, repeat)
        episode = f"eval-{uuid.uuid4().hex}"
        decision, outputs = run_episode(local.client, policy, item.extra["patient_id"], episode, max_calls)
        score = compute_score(item.data_source, decision.final_message(), item.ground_truth, item.extra)
        transcript = getattr(policy, "messages", None)
        record = trajectory.to_record(item, outputs, decision, score, out, schemas, transcript, repeat)
        record["options"] = len(item.extra["options"])
        with lock, path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(one, item, repeat) for item, repeat in todo]
        bar = tqdm(
            total=len(rollouts), initial=len(rollouts) - len(todo), desc=f"eval {agent}", disable=not progress
        )
        for future in as_completed(futures):
            future.result()
            bar.update()
        bar.close()
    keys = {trajectory.rollout_id(item, r) for item, r in rollouts}
    records = [r for r in trajectory.read(path) if r["id"] in keys]
    results = summarise(records, agent, str(bank), server_version)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_report(out)
    return results
