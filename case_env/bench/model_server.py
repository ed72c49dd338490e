"""`case-env bench server --env NAME` for an environment whose tools and reward wait on a language model.

A training step of 64 prompts x 16 samples holds 1,024 episodes at once, each waiting on a simulated patient
or a judge. This plays that against the real server with the model replaced by a loopback stand-in
(`case_env.bench.standin`) answering after a fixed latency and failing a chosen share of requests:
- **calls**: `--rollouts` concurrent rollouts of the `episode` mix, once per `--model-latency-ms`: calls/s,
  p50/p99 per tool, errors and the model's fallbacks;
- **burst**: 1,024 episodes ask the model at once, answered in 1 s: the time to the last answer against
  ceil(1,024 / requests let in flight) x 1 s;
- **rewards**: `--rewards` rows scored by the coroutine reward verl awaits, the judge at `--judge-latency-ms`:
  the time against one request at a time (requests x latency). `--runs N` repeats the whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from case_env.bench import doors as ways
from case_env.bench.load import LoadProcess
from case_env.bench.process import ServerProcess
from case_env.bench.standin import StandInProcess
from case_env.core.llm import DEFAULT_CONCURRENCY
from case_env.core.parts import ServerBench, ServerBenchOptions
from case_env.core.text_cases import cases_variable

LATENCIES_MS = (0.0, 300.0, 2000.0)
BURST = 1024
BURST_LATENCY_MS = 1000.0
REWARDS = 1024
JUDGE_LATENCY_MS = 500.0
# the launcher's default for verl's rate-limited manager (`--judge-concurrency`): one vLLM judge's batch
REWARD_CONCURRENCY = 256
FALLBACKS = re.compile(r"^case_env_model_fallbacks_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def bench_server(env: Any, options: ServerBenchOptions, echo: Callable[[str], object]) -> dict:
    """`case-env bench server --env NAME`: the environment's own benchmark, else the generic one."""
    figures = env.bench_server(options, echo)
    if figures is not None:
        return figures
    if env.server_bench is None:
        raise ValueError(f"the {env.name} environment has no server benchmark")
    return run_model_bench(env, env.server_bench, options, echo)


def run_model_bench(
    env: Any, bench: ServerBench, options: ServerBenchOptions, echo: Callable[[str], object]
) -> dict:
    options.refuse(env.name, ("data_root", "baseline", "cache_mb", "doors", "stores"))
    latencies = options.latencies or list(LATENCIES_MS)
    failure = options.model_failure_rate or 0.0
    judge_ms = JUDGE_LATENCY_MS if options.judge_latency_ms is None else options.judge_latency_ms
    out = options.out
    scratch = out / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    settings = bench.cases(scratch)
    loaded = env.load_cases([Path(settings[cases_variable(env.name)])])
    ids = [case.case_id for case in loaded.cases]
    runs = []
    with LoadProcess(scratch / "load.log") as loads:
        for n in range(options.runs):
            run: dict[str, Any] = {"calls": {}}
            for latency in latencies:
                echo(
                    f"run {n + 1}: {options.rollouts} rollouts, the model at {latency:g} ms, failing {failure:.0%}"
                )
                run["calls"][f"{latency:g}"] = _calls(
                    env.name, bench, options, settings, loads, ids, latency, failure, n
                )
                echo("  " + _calls_line(run["calls"][f"{latency:g}"]))
            run["burst"] = _burst(bench, options, settings, ids, n)
            echo("  " + _burst_line(run["burst"]))
            run["rewards"] = _rewards(bench, options.rewards or REWARDS, judge_ms, failure, n)
            echo("  " + _rewards_line(run["rewards"]))
            runs.append(run)
    result = {
        "benchmark": "server",
        "env": env.name,
        "rollouts": options.rollouts,
        "workers": options.workers,
        "duration_s": options.duration,
        "model_failure_rate": failure,
        "runs": runs,
        "summary": _summary(runs),
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    echo(f"wrote {out / 'bench.json'}")
    return result


@contextlib.contextmanager
def _served(
    bench: ServerBench, options: ServerBenchOptions, settings: dict, latency: float, failure: float, seed: int
) -> Iterator[tuple[StandInProcess, ServerProcess]]:
    """The stand-in model and `case-env serve` with its cases and the stand-in as its model, both running."""
    with StandInProcess(latency, failure, bench.model_reply, seed=seed) as model:
        env = {
            **settings,
            bench.model_setting: model.url,
            "CASE_ENV_WORKERS": str(options.workers),
            "CASE_ENV_DATA_ROOT": None,  # text cases only
            "CASE_ENV_TOKEN": None,
            "CASE_ENV_AUDIT_LOG": None,
            "CASE_ENV_EPISODE_DB": None,
        }
        with ServerProcess(options.out / "scratch" / "server.log", env) as server:
            yield model, server


def _calls(name, bench, options, settings, loads, ids, latency, failure, n) -> dict:
    with _served(bench, options, settings, latency, failure, n) as (model, server):
        figures = loads.run(
            server.url,
            ids,
            env=name,
            rollouts=options.rollouts,
            duration=options.duration,
            warmup=options.warmup,
            seed=n,
            think_s=options.think_ms / 1000,
            group_size=options.group_size,
        )
        figures["fallbacks"] = _fallbacks(server.url)
        figures["model"] = model.stats()
    figures["latency_ms_model"] = latency
    tool = bench.first_call(0)[0]  # the tool that waits on the model
    asked = figures["latency_ms"].get(tool, {}).get("n", 0) / figures["duration_s"]
    figures["model_tool_calls_per_s"] = round(asked, 1)
    if latency > 0:  # what the endpoint's bound allows: requests in flight over all workers, one reply each
        bound = options.workers * DEFAULT_CONCURRENCY / (latency / 1000)
        figures["model_bound_calls_per_s"] = round(bound, 1)
        figures["ratio_vs_model_bound"] = round(asked / bound, 3)
    return figures


def _fallbacks(url: str) -> int:
    scraped = httpx.get(f"{url}/metrics", timeout=30).text
    return int(sum(float(m) for m in FALLBACKS.findall(scraped)))


def _burst(bench: ServerBench, options: ServerBenchOptions, settings: dict, cases: list[str], n: int) -> dict:
    """BURST episodes' first call to the model at once, the model answering in BURST_LATENCY_MS, against one
    server worker: the bound is then the endpoint's own (how the kernel spreads a burst of connections over
    several workers is not the server's to choose)."""
    in_flight = DEFAULT_CONCURRENCY
    one_worker = options.model_copy(update={"workers": 1})
    with _served(bench, one_worker, settings, BURST_LATENCY_MS, 0.0, n) as (model, server):

        async def burst() -> tuple[float, dict[str, int]]:
            client = ways.session(BURST, timeout_s=120.0)
            outcomes: dict[str, int] = {}

            async def one(i: int) -> None:
                tool, arguments = bench.first_call(i)
                body = {
                    "episode_id": f"burst-{n}-{i}",
                    "patient_id": cases[i % len(cases)],
                    "arguments": arguments,
                }
                try:
                    async with client.post(f"{server.url}/v1/tools/{tool}", json=body) as reply:
                        status, payload = reply.status, await reply.read()
                    kind = "ok" if status == 200 and b'"ok":true' in payload else f"http_{status}"
                except ways.FAILURES as exc:
                    kind = type(exc).__name__
                outcomes[kind] = outcomes.get(kind, 0) + 1

            began = time.perf_counter()
            try:
                await asyncio.gather(*(one(i) for i in range(BURST)))
            finally:
                await client.close()
            return time.perf_counter() - began, outcomes

        elapsed, outcomes = asyncio.run(burst())
        seen = model.stats()
    bound = math.ceil(BURST / in_flight) * BURST_LATENCY_MS / 1000
    return {
        "episodes": BURST,
        "model_latency_ms": BURST_LATENCY_MS,
        "seconds": round(elapsed, 2),
        "bound_s": bound,
        "in_flight_allowed": in_flight,
        "model_peak_in_flight": seen["peak_in_flight"],
        "outcomes": outcomes,
    }


def _rewards(bench: ServerBench, count: int, judge_ms: float, failure: float, n: int) -> dict:
    """`count` rows scored by the coroutine reward, at most REWARD_CONCURRENCY at once, judge at `judge_ms`."""
    from case_env import reward
    from case_env.core import llm

    rows = bench.rewards(count)
    # what a reward worker loads once (its graders' tables), loaded before the clock starts
    reward.score_row(*rows[0])
    with StandInProcess(judge_ms, failure, bench.judge_reply, seed=n) as judge:
        saved = {k: os.environ.get(k) for k in ("CASE_ENV_JUDGE_URL", "CASE_ENV_JUDGE_CONCURRENCY")}
        os.environ["CASE_ENV_JUDGE_URL"] = judge.url
        os.environ["CASE_ENV_JUDGE_CONCURRENCY"] = str(REWARD_CONCURRENCY)
        llm.default_judge.cache_clear()
        try:

            async def batch() -> tuple[float, list]:
                gate = asyncio.Semaphore(REWARD_CONCURRENCY)  # as verl's rate-limited manager bounds it

                async def one(row: tuple) -> Any:
                    async with gate:
                        try:
                            return await reward.compute_score(*row)
                        except Exception as exc:  # counted, not raised: an error is a figure here
                            return exc

                began = time.perf_counter()
                scored = await asyncio.gather(*(one(row) for row in rows))
                return time.perf_counter() - began, scored

            elapsed, scored = asyncio.run(batch())
            seen = judge.stats()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            llm.default_judge.cache_clear()
    errors = sum(isinstance(s, Exception) for s in scored)
    keys = {tuple(sorted(s)) for s in scored if isinstance(s, dict)}
    judged = sum(1 for s in scored if isinstance(s, dict) and s.get("judge") == "judge")
    sequential = seen["requests"] * judge_ms / 1000
    return {
        "rows": count,
        "judge_latency_ms": judge_ms,
        "seconds": round(elapsed, 2),
        "judge_requests": seen["requests"],
        "sequential_bound_s": round(sequential, 1),
        "speedup_vs_sequential": round(sequential / elapsed, 1) if elapsed else None,
        "judged": judged,
        "fallbacks": count - judged - errors,
        "errors": errors,
        "key_sets": len(keys),
        "judge_peak_in_flight": seen["peak_in_flight"],
    }


def _calls_line(f: dict) -> str:
    tools = ", ".join(f"{tool} p50/p99 {x['p50']}/{x['p99']} ms" for tool, x in f["latency_ms"].items())
    bound = (
        f" ({f['ratio_vs_model_bound']:.0%} of the {f['model_bound_calls_per_s']:g}/s its bound allows)"
        if "ratio_vs_model_bound" in f
        else ""
    )
    return (
        f"{f['calls_per_s']} calls/s, {f['model_tool_calls_per_s']} of the tool that asks the model{bound}; {tools}; "
        f"errors {f['errors'] or 'none'}; fallbacks {f['fallbacks']}; model requests {f['model']['requests']} "
        f"(peak {f['model']['peak_in_flight']} in flight)"
    )


def _burst_line(b: dict) -> str:
    return (
        f"burst: {b['episodes']} episodes asking a {b['model_latency_ms']:g} ms model at once answered in "
        f"{b['seconds']} s by one server worker (bound {b['bound_s']:g} s: {b['in_flight_allowed']} in flight; peak "
        f"{b['model_peak_in_flight']}); answers: {_counts(b['outcomes'])} (a fixed burst: --rollouts sizes the "
        "calls above)"
    )


def _counts(outcomes: dict[str, int]) -> str:
    """{'ok': 1000, 'http_503': 24} as `1000 ok, 24 http_503`."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(outcomes.items(), key=lambda kv: -kv[1])) or "none"


def _rewards_line(r: dict) -> str:
    return (
        f"rewards: {r['rows']} scored with the judge at {r['judge_latency_ms']:g} ms in {r['seconds']} s; one "
        f"thread asking one request at a time: {r['sequential_bound_s']} s ({r['judge_requests']} requests), "
        f"{r['speedup_vs_sequential']}x; errors {r['errors']}, fallbacks {r['fallbacks']}, key sets {r['key_sets']}"
    )


def _summary(runs: list[dict]) -> dict:
    """Medians over the runs (each run's figures stay in `runs`)."""
    summary: dict[str, Any] = {"calls": {}}
    for latency in runs[0]["calls"]:
        per = [r["calls"][latency] for r in runs]
        summary["calls"][latency] = {
            "calls_per_s": statistics.median(p["calls_per_s"] for p in per),
            "p99_ms": {
                tool: statistics.median(p["latency_ms"][tool]["p99"] for p in per if tool in p["latency_ms"])
                for tool in per[0]["latency_ms"]
            },
            "errors": sum(sum(p["errors"].values()) for p in per),
            "fallbacks": sum(p["fallbacks"] for p in per),
        }
    summary["burst_s"] = statistics.median(r["burst"]["seconds"] for r in runs)
    summary["reward_speedup"] = statistics.median(r["rewards"]["speedup_vs_sequential"] for r in runs)
    return summary
