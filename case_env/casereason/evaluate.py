"""`case-env eval` on a case-reasoning bank: accuracy at 1, 5 and 10 attempts in both of MedCaseReasoning's
candidate readings of "k-shot" (shared/reference/seed-systems.md §3.5), and mean reasoning recall.

- independent: `samples` (10) independent answers per case from the prompt alone; accuracy at k is the
  unbiased pass@k estimate from those samples (1 - C(n - c, k) / C(n, k), c of n correct).
- sequential: one episode per case with up to 10 attempts through the server's `submit_diagnosis` (the real
  tool, with the episode's submissions as context, as the verl adapter sends them); accuracy at k counts the
  cases whose first correct attempt is among the first k.

Recall is measured on each case's first independent sample. Every answer is scored by the environment's
reward function, so eval and training agree on what is correct.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from case_env.casereason.agents import AGENTS as SCRIPTED
from case_env.casereason.agents import make_reader
from case_env.casereason.bank import SEQUENTIAL_RULE
from case_env.casereason.reward import casereason_score
from case_env.eval.bank import Item, load_items
from case_env.eval.openai_agent import ModelSettings

AGENTS = (*SCRIPTED, "openai")
KS = (1, 5, 10)


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


class OpenAIReader:
    """A model behind an OpenAI-compatible server: one completion per independent sample; in sequential mode
    a conversation with `submit_diagnosis`, each submission fed back by the server."""

    def __init__(self, item: Item, settings: ModelSettings, client, tool: dict | None):
        self.item, self.settings, self.client, self.tool = item, settings, client, tool

    def complete(self, messages: list[dict], tools: list[dict] | None = None):
        return self.client.chat.completions.create(
            model=self.settings.model, messages=messages, tools=tools, temperature=self.settings.temperature,
            max_tokens=self.settings.max_tokens, timeout=self.settings.timeout_s).choices[0].message  # fmt: skip

    def answer(self, sample: int = 0) -> str:
        return self.complete([dict(m) for m in self.item.prompt]).content or ""


def _submit(
    client: httpx.Client, case_id: str, episode: str, diagnosis: str, submissions: list[str], k: int
) -> str:
    body = {"episode_id": episode, "patient_id": case_id, "arguments": {"diagnosis": diagnosis},
            "context": {"submissions": submissions, "attempts": k}}  # fmt: skip
    reply = client.post("/v1/tools/submit_diagnosis", json=body)
    if reply.status_code == 404:
        raise LookupError(f"the server has no case {case_id!r}: serve the bank's cases "
                          "(CASE_ENV_CASEREASON_CASES, or <data root>/casereason/)")  # fmt: skip
    reply.raise_for_status()
    return reply.json()["text"]


def sequential(client: httpx.Client, item: Item, policy, k: int) -> str:
    """One episode of up to k submissions; returns the transcript the reward reads."""
    case_id, episode = item.extra["patient_id"], f"casereason-{uuid.uuid4().hex}"
    submissions: list[str] = []
    parts = []
    if isinstance(policy, OpenAIReader):
        messages = [dict(m) for m in item.prompt]
        if "submit_diagnosis" not in messages[-1]["content"]:  # an independent-mode row: say how to attempt
            messages[-1]["content"] += "\n\n" + SEQUENTIAL_RULE.format(k=k)
        for _ in range(k + 2):
            reply = policy.complete(messages, [policy.tool])
            calls = reply.tool_calls or []
            if not calls:
                parts.append(reply.content or "")
                break
            call = calls[0]
            try:
                diagnosis = str(json.loads(call.function.arguments or "{}").get("diagnosis", ""))
            except (ValueError, AttributeError):
                diagnosis = ""
            feedback = _submit(client, case_id, episode, diagnosis, submissions, k) if diagnosis else \
                "Error: give the diagnosis as a JSON object {\"diagnosis\": ...}."  # fmt: skip
            if diagnosis:
                submissions.append(diagnosis)
            messages += [{"role": "assistant", "content": reply.content or "", "tool_calls": [call.model_dump()]},
                         {"role": "tool", "tool_call_id": call.id, "content": feedback}]  # fmt: skip
            parts.append(_turn(reply.content or "", diagnosis, feedback))
        return "\n".join(parts)
    for attempt in range(k):
        diagnosis = (
            policy.candidate(0) if attempt == 0 else policy.ranking[min(attempt, len(policy.ranking) - 1)]
        )
        feedback = _submit(client, case_id, episode, diagnosis, submissions, k)
        submissions.append(diagnosis)
        parts.append(_turn(f"<think>\n{policy.trace(diagnosis)}\n</think>", diagnosis, feedback))
        if feedback.startswith("Correct"):
            break
    parts.append(f"<think>\nFinal.\n</think>\n<answer>{submissions[-1]}</answer>")
    return "\n".join(parts)


def _turn(text: str, diagnosis: str, feedback: str) -> str:
    call = json.dumps({"name": "submit_diagnosis", "arguments": {"diagnosis": diagnosis}})
    return f"{text}\n<tool_call>\n{call}\n</tool_call>\nuser\n<tool_response>\n{feedback}\n</tool_response>"


def summarise(records: list[dict], agent: str, bank: str, samples: int, k_max: int) -> dict:
    def block(rows: list[dict]) -> dict:
        n = len(rows)
        independent = {f"acc@{k}": round(sum(pass_at_k(samples, r["independent_correct"], k) for r in rows) / n, 4)
                       for k in KS if k <= samples}  # fmt: skip
        seq = {f"acc@{k}": round(sum(0 < r["sequential_first_correct"] <= k for r in rows) / n, 4)
               for k in KS if k <= k_max}  # fmt: skip
        return {"n": n, "independent": independent, "sequential": seq,
                "recall": round(sum(r["recall"] for r in rows) / n, 4),
                "format_error_rate": round(sum(not r["format_ok"] for r in rows) / n, 4),
                "mean_sequential_attempts": round(sum(r["sequential_attempts"] for r in rows) / n, 3)}  # fmt: skip

    by_source: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_source[r["data_source"]].append(r)
    return {"env": "casereason", "agent": agent, "bank": bank, "samples": samples, "attempts": k_max,
            "overall": block(records), "by_data_source": {k: block(v) for k, v in sorted(by_source.items())}}  # fmt: skip


def run_casereason_eval(bank: Path, server_url: str, agent: str, out: Path, concurrency: int = 4,
                        limit: int | None = None, token: str | None = None, model: ModelSettings | None = None,
                        samples: int = 10, k_max: int = 10) -> dict:  # fmt: skip
    if agent not in AGENTS:
        raise ValueError(f"unknown case-reasoning agent {agent!r}; choose one of {', '.join(AGENTS)}")
    items = load_items(bank)[:limit] if limit else load_items(bank)
    out.mkdir(parents=True, exist_ok=True)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    chat, tool = None, None
    if agent == "openai":
        if model is None:
            raise ValueError("the openai agent needs --model-url and --model")
        import openai

        chat = openai.OpenAI(base_url=model.base_url, api_key=model.api_key, max_retries=2)
        with httpx.Client(base_url=server_url, headers=headers, timeout=30) as probe:
            tools = probe.get("/v1/tools").raise_for_status().json()["tools"]
        tool = next(t["schema"] for t in tools if t["name"] == "submit_diagnosis")
    local = threading.local()

    def one(item: Item) -> dict:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=server_url, headers=headers, timeout=60.0)
        prompt = item.prompt[-1]["content"]
        policy = OpenAIReader(item, model, chat, tool) if agent == "openai" else make_reader(agent, item.extra["patient_id"], prompt)  # type: ignore[arg-type]  # fmt: skip
        single = {**item.extra, "casereason": {**item.extra["casereason"], "attempts": 1}}
        answers = [policy.answer(s) for s in range(samples)]
        scores = [casereason_score(a, item.ground_truth, single) for a in answers]
        multi = {**item.extra, "casereason": {**item.extra["casereason"], "attempts": k_max}}
        transcript = sequential(local.client, item, policy, k_max)
        seq = casereason_score(transcript, item.ground_truth, multi)
        return {"id": item.key, "patient_id": item.extra["patient_id"], "data_source": item.data_source,
                "ground_truth": item.ground_truth, "independent_correct": sum(int(s["acc"]) for s in scores),
                "independent_preds": [s["pred"] for s in scores], "recall": scores[0]["recall"],
                "format_ok": scores[0]["format_ok"], "sequential_first_correct": seq["first_correct"],
                "sequential_attempts": seq["attempts"], "first_answer": answers[0], "sequential": transcript}  # fmt: skip

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        records = list(pool.map(one, items))
    with (out / "trajectories.jsonl").open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    results = summarise(records, agent, str(bank), samples, k_max)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results
