"""The load generator of the server benchmarks, run as its own process so its CPU is not the server's.

Each virtual rollout plays episodes one after another over a random case with a fresh episode id, as a verl
rollout does, an episode's calls drawn from one of the environment's mixes (`Benchmarks.bench_mixes`). With
`group_size` G, groups of G rollouts share the case and every drawn argument, as the samples of one GRPO
prompt would if they agreed on every call. All rollouts share one event loop and one aiohttp pool, a keep-alive
connection each (`bench.doors`), and the generator reports its own CPU per call. Latencies are wall time
per call as the client sees it, queueing included. `protocol` chooses the way in (`bench.doors`: the tool
API, OpenEnv's `POST /step`, case-env's OpenEnv and MCP doors); `record` keeps each tool's first answer,
the bytes the floor baseline replays. A benchmark keeps one such process (`LoadProcess`) for all its runs.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import uvloop

from case_env.bench import doors as ways
from case_env.bench.doors import Door
from case_env.core import registry
from case_env.core.parts import Benchmarks, Plan


def plan_of(env: str | None, mix: str) -> Plan:
    """The episode plan of an environment's mix (its `Benchmarks` part), refused by name when it has none."""
    found = registry.get(env) if env else registry.default()
    mixes = found.bench_mixes if isinstance(found, Benchmarks) else {}
    if mix not in mixes:
        raise ValueError(
            f"the {found.name} environment has no benchmark mix {mix!r}; its mixes: {', '.join(mixes) or 'none'}"
        )
    return mixes[mix]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


class Tally:
    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)


async def _rollout(
    door: Door,
    case_ids: list[str],
    stop: float,
    rng: random.Random,
    tally: Tally,
    think_s: float,
    plan: Plan,
    episodes: int | None = None,
    member: int = 0,
    record: Path | None = None,
) -> None:
    done = 0
    while time.perf_counter() < stop and (episodes is None or done < episodes):
        done += 1
        case_id = rng.choice(case_ids)
        # members of a group share the draws
        await door.begin(case_id, f"bench-{rng.getrandbits(64):016x}-{member}")
        for tool, arguments, *context in plan(rng):
            if think_s > 0:
                await asyncio.sleep(rng.expovariate(1 / think_s))  # the policy generating its next turn
            if time.perf_counter() >= stop:
                return
            started = time.perf_counter()
            try:
                kind, payload = await door.call(tool, arguments, context[0] if context else None)
                if kind == "ok" and record is not None and not (record / f"{tool}.json").exists():
                    (record / f"{tool}.json").write_bytes(payload)
            except ways.FAILURES as exc:
                kind = type(exc).__name__
            elapsed = time.perf_counter() - started
            if kind == "ok":
                tally.samples[tool].append(elapsed)
            else:
                tally.errors[kind] += 1


async def run_load(
    url: str,
    case_ids: list[str],
    rollouts: int,
    duration: float,
    warmup: float,
    seed: int = 0,
    think_s: float = 0.0,
    episodes: int | None = None,
    group_size: int = 1,
    mix: str = "episode",
    protocol: str = "case-env",
    record: Path | None = None,
    env: str | None = None,
) -> dict:
    """Play `mix` of `env` (default: the default environment) from `rollouts` concurrent rollouts."""
    plan = plan_of(env, mix)
    if record is not None:
        record.mkdir(parents=True, exist_ok=True)
    name = env or registry.default().name
    client = ways.session(rollouts)
    doors = [Door(url, name, protocol, client) for _ in range(rollouts)]  # kept from the warm-up on
    master = random.Random(seed)

    async def phase(seconds: float, tally: Tally, limit: int | None) -> None:
        """Every rollout until `seconds` pass; the members of a group share one seed."""
        stop = time.perf_counter() + seconds
        seeds = [master.random() for _ in range(-(-rollouts // group_size))]
        await asyncio.gather(
            *[
                _rollout(
                    doors[n],
                    case_ids,
                    stop,
                    random.Random(seeds[n // group_size]),
                    tally,
                    think_s,
                    plan,
                    limit,
                    member=n % group_size,
                    record=record,
                )
                for n in range(rollouts)
            ]
        )

    try:
        await phase(warmup, Tally(), None)
        tally = Tally()
        began, started, cpu = time.time(), time.perf_counter(), time.process_time()
        await phase(duration, tally, episodes)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        for door in doors:
            await door.close()
        await client.close()
    result = summarise(tally, rollouts, elapsed)
    result["load_cpu_ms_per_call"] = round(1000 * cpu / max(result["calls"], 1), 3)
    return {**result, "window": [began, began + elapsed]}


def summarise(tally: Tally, rollouts: int, elapsed: float) -> dict:
    calls = sum(len(v) for v in tally.samples.values())
    everything = [s for v in tally.samples.values() for s in v]

    def figures(values: list[float]) -> dict:
        return {
            "n": len(values),
            "p50": round(1000 * percentile(values, 50), 1),
            "p95": round(1000 * percentile(values, 95), 1),
            "p99": round(1000 * percentile(values, 99), 1),
            "mean": round(1000 * statistics.fmean(values), 1) if values else float("nan"),
        }

    return {
        "rollouts": rollouts,
        "duration_s": round(elapsed, 2),
        "calls": calls,
        "calls_per_s": round(calls / elapsed, 1),
        "errors": dict(sorted(tally.errors.items())),
        "latency_ms": {tool: figures(v) for tool, v in sorted(tally.samples.items())},
        "latency_ms_all": figures(everything),
    }


def serve_jobs() -> None:
    """Loads one after another: each a JSON line of `run_load`'s arguments on stdin, its figures one JSON
    line on stdout (`{"error": ...}` when it failed)."""
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("record"):
            job["record"] = Path(job["record"])
        try:
            # uvloop, as uvicorn runs the servers: a quarter less client CPU per call
            answer = uvloop.run(run_load(**job))
        except Exception as exc:  # the benchmark reports it; this process waits for the next job
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class LoadProcess:
    """The benchmark's one load-generator process, fed a job per run. A process per run spent about 1 s in
    interpreter start-up and imports each: 100 s of a full `case-env bench server`'s 95 runs."""

    def __init__(self, log: Path):
        self.log = log
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> LoadProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "case_env.bench.load"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            )
        return self

    def run(self, url: str, case_ids: list[str], **job) -> dict:
        """`run_load(url, case_ids, **job)` in the load process; its figures."""
        assert self.process is not None and self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps({"url": url, "case_ids": case_ids, **job}, default=str) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        answer = json.loads(line) if line else {"error": self.log.read_text()[-2000:] or "it exited"}
        if "error" in answer:
            raise RuntimeError(f"load generator failed: {answer['error']}")
        return answer

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


if __name__ == "__main__":
    serve_jobs()
