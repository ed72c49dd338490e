"""`case-env bench server`: throughput, per-tool latency and server CPU per call of the real server under
many concurrent rollouts, against peers and floors in the same run.

Baselines (`--baseline`, any subset): `naive`, the same app over a naive data engine (`naive.py`); `openenv`,
the same tools through OpenEnv's own app factory (`openenv_engine.py`); `floor`, a bare Starlette route
replaying case-env's answers (`floor.py`). Each engine runs under uvicorn in its own process group, driven
by the load generator (`case_env.bench.load`) in another process through the episode, cheap and render mixes
(`bench/mixes.py`), case-env with its response cache on and off. The server's process tree is sampled for
CPU and memory over exactly the measured window; the cheap mix runs its engines in turns (`run_paired`) so
the machine's drift falls on all alike, and every run starts with the data in the page cache.
With `--stores sqlite,redis`, case-env's episode and cheap mixes run once per episode store, in turns: the
embedded SQLite file and a real `redis-server` started for the benchmark, whose CPU counts as the server's.
`bench.json` holds every run and the ratios per mix; `bench.png` plots them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from case_env.bench.load import LoadProcess
from case_env.bench.measure import Sampler, merged_turns, page_in
from case_env.bench.process import RedisServer, ServerProcess, free_port
from case_env.core.parts import ServerBenchOptions
from case_env.envs.imaging.bench.mixes import episode_calls
from case_env.envs.imaging.data.index import scan
from case_env.envs.imaging.settings import ImagingSettings
from case_env.server.connections import PROTOCOL as HTTP_PROTOCOL

ENGINES = {
    "case-env": "case_env.server.app:create_app",
    "naive": "case_env.envs.imaging.bench.naive:create_app",
    "openenv": "case_env.envs.imaging.bench.openenv_engine:create_app",
    "floor": "case_env.envs.imaging.bench.floor:create_app",
}
BASELINES = ("naive", "openenv", "floor")
# case-env's app with one door on (`--doors`): the same tools through OpenEnv's WebSocket session or MCP
DOORS = {"openenv-door": "verl,openenv", "mcp-door": "verl,mcp"}
ENGINES.update(dict.fromkeys(DOORS, ENGINES["case-env"]))
# the load generator speaks case-env's protocol to the others
PROTOCOL = {"openenv": "openenv", "openenv-door": "openenv-door", "mcp-door": "mcp-door"}
# the engines served by case-env's app as `case-env serve` runs it: its /metrics, its HTTP protocol
CASE_ENV_APPS = ("case-env", "naive", *DOORS)
DOOR_WORKERS = 1  # an MCP episode lives in the worker that started it: the doors' runs use one worker
MIXES = ("episode", "cheap", "render")
STORES = ("sqlite", "redis")
RENDER_TOOLS = ("render_slice", "render_comparison")
BENCH_PATIENTS = 48  # the default dataset: enough patients that the response cache is not the headline
PROBE_EPISODES = 2  # episodes of the unloaded single-rollout probe after each load
PROBE_LIMIT_S = 120.0

# 256 concurrent rollouts on a 2-core machine. The cheap call within 3x the floor's server CPU: FastAPI's
# routing and validation and a store write per call, with no code in front of the libraries (a fast path in
# front of FastAPI once held it within 2x, a tenth of a millisecond no rollout waits on)
TARGETS = {
    "calls_per_s": 600.0,
    "render_p99_ms": 250.0,
    "text_p99_ms": 100.0,
    "ratio_throughput": 30.0,
    "cheap_cpu_vs_floor": 3.0,
    "calls_per_s_no_cache": 1000.0,
    "render_cpu_ms": 1.5,
    "door_cpu_vs_api": 1.5,  # a door's server CPU per call of the episode mix, against the tool API's
    "throughput_vs_openenv": 1.5,  # calls/s against OpenEnv's own server, on every mix, response cache off
    "store_cpu_vs_sqlite": 1.5,  # Redis's CPU per call (server and redis-server) against SQLite's
}


@dataclass(frozen=True)
class Load:
    """What one engine run asks of the load generator."""

    rollouts: int
    duration: float
    warmup: float
    think_ms: float = 0.0
    group_size: int = 1


@dataclass(frozen=True)
class Setup:
    """One server configuration of a run: an engine, the mix it serves, its response cache."""

    engine: str
    mix: str = "episode"
    response_cache: bool = True
    workers: int | None = None  # the run's own worker count (the doors' comparison), else the bench's
    label: str = ""  # kept apart from the run of the same engine and mix
    store: str = "sqlite"  # where case-env's episodes live: the SQLite file, or the benchmark's Redis

    @property
    def tag(self) -> str:
        cache = "cache" if self.response_cache else "nocache"
        return f"{self.engine}-{self.mix}-{cache}-{self.store}{self.label.replace('/', '-')}"


@contextlib.contextmanager
def _serving(
    setup: Setup, data_root: Path, scratch: Path, workers: int, cache_mb: int | None, redis: str | None
):
    """The engine's server, started (in its own process group, as `case-env serve` runs case-env's app)."""
    env = {
        "CASE_ENV_DATA_ROOT": str(data_root),
        "CASE_ENV_CACHE_DIR": str(
            ImagingSettings(data_root=data_root).cache_dir
        ),  # decoded once, for every run
        "CASE_ENV_EPISODE_DB": str(scratch / f"episodes-{setup.tag}.sqlite"),
        # as `case-env serve --workers N` sets it: each worker sizes its render pool to cores / workers
        "CASE_ENV_WORKERS": str(workers),
        "PROMETHEUS_MULTIPROC_DIR": str(scratch / f"metrics-{setup.tag}"),
        "CASE_ENV_TOKEN": None,
        "CASE_ENV_AUDIT_LOG": None,
        "CASE_ENV_FLOOR_ANSWERS": str(scratch / "answers"),
        "CASE_ENV_PROTOCOLS": DOORS.get(setup.engine, "verl"),
    }
    if setup.store == "redis":
        assert redis is not None, "a Redis run without the benchmark's Redis"
        env["CASE_ENV_STORE"] = redis
    if not setup.response_cache:
        env["CASE_ENV_RESPONSE_CACHE_MB"] = "0"
    if cache_mb is not None:
        env["CASE_ENV_CACHE_BYTES"] = str(cache_mb * 2**20)
    (scratch / f"metrics-{setup.tag}").mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [
        *(sys.executable, "-m", "uvicorn", ENGINES[setup.engine], "--factory", "--host", "127.0.0.1"),
        *("--port", str(port), "--workers", str(workers), "--log-level", "warning", "--no-access-log"),
    ]
    if setup.engine in CASE_ENV_APPS:  # as `case-env serve` runs them
        command += ["--http", HTTP_PROTOCOL, "--ws-per-message-deflate", "false"]
    with ServerProcess(scratch / f"server-{setup.tag}.log", env, port=port, command=command) as server:
        yield server


def progress(text: str) -> None:
    """What runs now, on one line of a terminal; nothing when stderr is not one (CI logs stay as they were)."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{text}" if text else "\r\033[K")
        sys.stderr.flush()


@dataclass(frozen=True)
class Bench:
    """Where and how a benchmark's runs are made: the data, the scratch directory, the load, the workers."""

    data_root: Path
    cases: list[str]
    scratch: Path
    loads: LoadProcess
    load: Load
    workers: int
    cache_mb: int | None = None
    redis: RedisServer | None = None  # the Redis of the runs that keep their episodes there

    def serving(self, setup: Setup):
        workers = setup.workers or self.workers
        redis = self.redis.url if self.redis is not None else None
        return _serving(setup, self.data_root, self.scratch, workers, self.cache_mb, redis)

    def sampler(self, setup: Setup, server: ServerProcess) -> Sampler:
        """The server's process tree, and the Redis its episodes live in when they live there."""
        extra = [psutil.Process(self.redis.pid)] if setup.store == "redis" and self.redis else []
        return Sampler(psutil.Process(server.pid), extra=extra)

    def load_on(
        self,
        url: str,
        setup: Setup,
        name: str,
        load: Load,
        record: Path | None = None,
        episodes: int | None = None,
    ) -> dict:
        """The figures of one load of `setup`'s mix on `url`, run by the benchmark's load process (`name`
        labels its progress line)."""
        progress(f"{setup.engine}{setup.label} ({setup.mix} mix, {name}): {load.warmup + load.duration:g} s")
        return self.loads.run(
            url,
            self.cases,
            rollouts=load.rollouts,
            duration=load.duration,
            warmup=load.warmup,
            think_s=load.think_ms / 1000,
            episodes=episodes,
            group_size=load.group_size,
            mix=setup.mix,
            protocol=_protocol(setup),
            record=record,
            env="imaging",
        )


def run_engine(bench: Bench, setup: Setup, record: Path | None = None) -> dict:
    """One engine under one load: its figures, server CPU per call over the measured window and (case-env)
    how its response cache answered. `record` keeps each tool's first answer for the floor."""
    page_in(_data_directories(bench.data_root))
    with bench.serving(setup) as server:
        with bench.sampler(setup, server) as sampler:
            result = bench.load_on(server.url, setup, "load", bench.load, record)
        cpu = sampler.cpu_between(*result["window"])
        result.update(_after(bench, setup, server.url))
    return _figures(setup, result, cpu, sampler, bench.workers)


def run_paired(bench: Bench, setups: list[Setup], rounds: int = 4) -> dict[str, dict]:
    """Several engines under the same load in turns: every server up at once, each measured for a share of
    the duration in each round, the order rotated from round to round. This machine's speed drifts by tens
    of percent within a minute (the same case-env cheap call cost 0.183 and 0.235 ms in runs a
    minute apart, the floor's run between them), so a ratio of runs made one after the other measured the
    drift as much as the engines; in turns, each engine sees the same spread of the machine's states. Server
    CPU is read from the process tree before and after each turn; latency percentiles are the median of
    the rounds'."""
    load = bench.load
    page_in(_data_directories(bench.data_root))
    share = Load(load.rollouts, load.duration / rounds, 0.0, load.think_ms, load.group_size)
    warm = Load(load.rollouts, max(load.warmup, 1.0), 0.0, load.think_ms, load.group_size)
    with contextlib.ExitStack() as stack:
        servers = {s: stack.enter_context(bench.serving(s)) for s in setups}
        samplers = {s: bench.sampler(s, server) for s, server in servers.items()}
        for s, server in servers.items():  # the warm-up, unmeasured
            bench.load_on(server.url, s, "warm", warm)
        turns: dict[Setup, list[tuple[dict, float]]] = {s: [] for s in setups}
        for round_ in range(rounds):
            for s in setups[round_ % len(setups) :] + setups[: round_ % len(setups)]:
                before = samplers[s].cpu_seconds()
                result = bench.load_on(servers[s].url, s, f"load-{round_}", share)
                turns[s].append((result, samplers[s].cpu_seconds() - before))
                samplers[s].note_memory()
        figures = {}
        for s, server in servers.items():
            result = merged_turns([r for r, _ in turns[s]], load.rollouts)
            result.update(_after(bench, s, server.url))
            result["rounds"] = [
                {
                    "calls_per_s": r["calls_per_s"],
                    "server_cpu_ms_per_call": round(1000 * c / max(r["calls"], 1), 3),
                }
                for r, c in turns[s]
            ]
            figures[s] = _figures(
                s, result, sum(c for _, c in turns[s]), samplers[s], s.workers or bench.workers
            )
    return {_run_name(s): f for s, f in figures.items()}


def _protocol(setup: Setup) -> str:
    return PROTOCOL.get(setup.engine, "case-env")


def _run_name(setup: Setup) -> str:
    """The run's key in bench.json: `case-env/cheap/no-cache`, `floor/cheap`, `openenv`."""
    parts = [setup.engine] + ([setup.mix] if setup.mix != "episode" else [])
    if setup.engine == "case-env" and not setup.response_cache:
        parts.append("no-cache")
    if setup.store != "sqlite":
        parts.append(setup.store)
    return "/".join(parts) + setup.label


def _data_directories(data_root: Path) -> list[Path]:
    cache_dir = ImagingSettings(data_root=data_root).cache_dir
    return [data_root, cache_dir / "decoded", cache_dir / "derived"]


def _after(bench: Bench, setup: Setup, url: str) -> dict:
    """What a run reads once its load is over: (case-env) how the response cache answered, and one rollout
    alone, once the backlog has drained: each tool's service time without queueing."""
    extra: dict = {}
    if setup.engine in CASE_ENV_APPS:
        extra["response_cache_hit_rate"] = _response_cache(url) if setup.response_cache else 0.0
        _drain(url)
    probe = bench.load_on(url, setup, "probe", PROBE, episodes=PROBE_EPISODES)
    extra["unloaded_ms"] = {tool: f["mean"] for tool, f in probe["latency_ms"].items()}
    extra["unloaded_episode_ms"] = _episode_ms(probe) if setup.mix == "episode" else None
    return extra


def _figures(setup: Setup, result: dict, cpu: float, sampler: Sampler, workers: int) -> dict:
    calls = max(result["calls"], 1)
    result.update(
        {
            "engine": setup.engine,
            "mix": setup.mix,
            "response_cache": setup.response_cache,
            "store": setup.store,
            "workers": workers,
            "server_cpu_cores": round(cpu / result["duration_s"], 2),
            "server_cpu_ms_per_call": round(1000 * cpu / calls, 3),
            "server_peak_rss_mb": round(sampler.peak_rss / 2**20, 1),
            "server_peak_pss_mb": round(sampler.peak_pss / 2**20, 1),
        }
    )
    return result


PROBE = Load(1, PROBE_LIMIT_S, 0.0)


def _samples(url: str, metric: str) -> list[tuple[str, float]]:
    """(labels, value) of each sample of one metric on the server's /metrics."""
    samples = []
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(metric) and line[len(metric) : len(metric) + 1] in ("{", " "):
            series, _, value = line.rpartition(" ")
            samples.append((series[len(metric) :], float(value)))
    return samples


def _response_cache(url: str) -> float:
    """The share of calls the response cache answered (hit or shared), from the server's own counters."""
    counts = {"hit": 0.0, "shared": 0.0, "miss": 0.0}
    for labels, value in _samples(url, "case_env_response_cache_total"):
        result = labels.split('result="', 1)[1].split('"', 1)[0]
        counts[result] = counts.get(result, 0.0) + value
    total = sum(counts.values())
    return round((counts["hit"] + counts["shared"]) / total, 3) if total else 0.0


def _drain(url: str, limit_s: float = 60.0) -> None:
    """Wait until no call is in flight (the naive engine keeps working through its backlog after a load)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if sum(value for _, value in _samples(url, "case_env_calls_in_flight")) == 0:
            return
        time.sleep(0.5)


def _episode_ms(probe: dict) -> float | None:
    """Unloaded time of one whole episode: the mean of each call in the episode's sequence, summed."""
    means = {tool: f["mean"] for tool, f in probe["latency_ms"].items()}
    tools = [tool for tool, _ in episode_calls(random.Random(0))]
    return round(sum(means[t] for t in tools), 1) if all(t in means for t in tools) else None


def _worst_p99(run: dict, tools: tuple[str, ...], include: bool) -> float:
    values = [f["p99"] for t, f in run["latency_ms"].items() if (t in tools) == include]
    return max(values) if values else float("nan")


def verdict(runs: dict[str, dict], ratios: dict[str, dict]) -> dict:
    fast = runs["case-env"]
    checks = {
        "calls_per_s": fast["calls_per_s"] >= TARGETS["calls_per_s"],
        "render_p99_ms": _worst_p99(fast, RENDER_TOOLS, True) < TARGETS["render_p99_ms"],
        "text_p99_ms": _worst_p99(fast, RENDER_TOOLS, False) < TARGETS["text_p99_ms"],
        "zero_errors": not any(run["errors"] for run in runs.values() if run["engine"] == "case-env"),
        "calls_per_s_no_cache": runs["case-env/no-cache"]["calls_per_s"] >= TARGETS["calls_per_s_no_cache"],
        "render_cpu_ms": runs["case-env/render/no-cache"]["server_cpu_ms_per_call"]
        <= TARGETS["render_cpu_ms"],
    }
    if "naive" in ratios:
        checks["ratio_throughput"] = ratios["naive"]["episode"]["throughput"] >= TARGETS["ratio_throughput"]
    if "floor" in ratios:
        checks["cheap_cpu_vs_floor"] = all(
            ratios["floor"][mix]["cpu_per_call"] <= TARGETS["cheap_cpu_vs_floor"]
            for mix in ("cheap", "cheap/no-cache")
        )
    if "openenv" in ratios:  # every mix OpenEnv ran, case-env's response cache off
        checks["throughput_vs_openenv"] = all(
            r["throughput"] >= TARGETS["throughput_vs_openenv"]
            for mix, r in ratios["openenv"].items()
            if mix.endswith("no-cache")
        )
    return checks


def store_verdict(store_ratios: dict[str, dict]) -> dict:
    """Redis within `store_cpu_vs_sqlite` of SQLite's CPU per call, on every mix both ran."""
    if not store_ratios:
        return {}
    limit = TARGETS["store_cpu_vs_sqlite"]
    return {"store_cpu_vs_sqlite": all(r["cpu_per_call"] <= limit for r in store_ratios.values())}


def store_vs_sqlite(runs: dict[str, dict]) -> dict:
    """Each Redis run against the SQLite run of the same mix: its throughput and CPU per call (server and
    redis-server together) as Redis ÷ SQLite."""
    out = {}
    for name, run in runs.items():
        if run.get("store") != "redis":
            continue
        sqlite = runs[name.removesuffix("/redis")]
        key = name.removeprefix("case-env/").removesuffix("/redis")
        out[key] = {
            "throughput": _ratio(run["calls_per_s"], sqlite["calls_per_s"]),
            "cpu_per_call": _ratio(run["server_cpu_ms_per_call"], sqlite["server_cpu_ms_per_call"]),
        }
    return out


def door_vs_api(runs: dict[str, dict], door: str) -> dict:
    """A door against the tool API on the same workers: its throughput and server CPU per call as door ÷ API,
    its p99 latency over the API's (above 1: the door is slower)."""
    run, api = runs[door], runs["case-env/doors"]
    return {
        "throughput": _ratio(run["calls_per_s"], api["calls_per_s"]),
        "p99": _ratio(run["latency_ms_all"]["p99"], api["latency_ms_all"]["p99"]),
        "cpu_per_call": _ratio(run["server_cpu_ms_per_call"], api["server_cpu_ms_per_call"]),
    }


def door_verdict(runs: dict[str, dict], door_ratios: dict[str, dict]) -> dict:
    """Each door within `door_cpu_vs_api` of the API's server CPU per call, with no errors."""
    return {
        f"{door}_cpu_vs_api": r["cpu_per_call"] <= TARGETS["door_cpu_vs_api"] and not runs[door]["errors"]
        for door, r in door_ratios.items()
    }


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("inf")


def ratios_vs(runs: dict[str, dict], baseline: str) -> dict:
    """case-env against one baseline, mix by mix (and case-env's no-cache runs against the same mix)."""
    out = {}
    for name, run in runs.items():
        if run["engine"] != "case-env" or name.endswith("/doors") or run.get("store", "sqlite") != "sqlite":
            continue
        other = runs.get(baseline if run["mix"] == "episode" else f"{baseline}/{run['mix']}")
        if other is None:
            continue
        key = name.removeprefix("case-env/") if name != "case-env" else "episode"
        out[key] = {
            "throughput": _ratio(run["calls_per_s"], other["calls_per_s"]),
            "p99": _ratio(other["latency_ms_all"]["p99"], run["latency_ms_all"]["p99"]),
            "cpu_per_call": _ratio(run["server_cpu_ms_per_call"], other["server_cpu_ms_per_call"]),
        }
    if baseline == "naive" and "episode" in out:
        naive, fast = runs["naive"], runs["case-env"]
        out["episode"]["unloaded_episode"] = _ratio(
            naive["unloaded_episode_ms"] or 0, fast["unloaded_episode_ms"] or 0
        )
    return out


def _decode_once(data_root: Path, patients: list[str]) -> None:
    """Every patient's volumes decoded into the shared cache, and its windows and organ extents stored
    beside them, before the first run, so no run pays for work that the next run reuses (the order of runs
    would otherwise decide the figures)."""
    from case_env.core import registry

    store = registry.get("imaging").open_cases(ImagingSettings(data_root=data_root))
    for patient in patients:
        store.patients.preload(patient)
        store.imaging.warm(patient)


def parse_baselines(text: str | None) -> list[str]:
    """'naive,openenv,floor' (any subset, in any order) → the list, checked."""
    chosen = [b.strip() for b in (text or "").split(",") if b.strip()]
    unknown = [b for b in chosen if b not in BASELINES]
    if unknown:
        raise ValueError(
            f"unknown baseline {unknown[0]!r}; choose from {', '.join(BASELINES)} (comma-separated)"
        )
    if "openenv" in chosen:
        _needs("openenv.core.env_server.http_server", "the openenv baseline", "openenv")
    return list(dict.fromkeys(chosen))


def parse_stores(text: str | None) -> list[str]:
    """'sqlite,redis' → the list, checked (Redis needs its server installed)."""
    chosen = [s.strip() for s in (text or "sqlite").split(",") if s.strip()]
    unknown = [s for s in chosen if s not in STORES]
    if unknown:
        raise ValueError(f"unknown store {unknown[0]!r}; choose from {', '.join(STORES)} (comma-separated)")
    if "redis" in chosen and shutil.which("redis-server") is None:
        raise ValueError("the redis store needs redis-server (Debian: apt-get install redis-server)")
    return list(dict.fromkeys(chosen))


def parse_doors(text: str | None) -> list[str]:
    """'openenv,mcp' → the engines of those doors, checked (their extras installed)."""
    chosen = [d.strip() for d in (text or "").split(",") if d.strip()]
    unknown = [d for d in chosen if f"{d}-door" not in DOORS]
    if unknown:
        raise ValueError(f"unknown door {unknown[0]!r}; choose from openenv, mcp (comma-separated)")
    for door in chosen:
        _needs(
            "openenv.core.env_server.http_server" if door == "openenv" else "mcp.server",
            f"the {door} door",
            door,
        )
    return [f"{d}-door" for d in dict.fromkeys(chosen)]


def _needs(module: str, what: str, extra: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        raise ValueError(
            f"{what} needs {exc.name}; install the extra: pip install 'case-env[{extra}]'"
        ) from None


def run_server_bench(
    data_root: Path,
    out: Path,
    rollouts: int,
    duration: float,
    workers: int,
    warmup: float,
    baselines: list[str] | None = None,
    cache_mb: int | None = None,
    think_ms: float = 0.0,
    group_size: int = 1,
    doors: list[str] | None = None,
    stores: list[str] | None = None,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    baselines, doors, stores = baselines or [], doors or [], stores or ["sqlite"]
    index = scan(data_root)
    load = Load(rollouts, duration, warmup, think_ms, group_size)
    _decode_once(data_root, index.patient_ids())
    with tempfile.TemporaryDirectory(prefix="case-env-bench-") as tmp, contextlib.ExitStack() as stack:
        scratch = Path(tmp)
        loads = stack.enter_context(LoadProcess(scratch / "load.log"))
        redis = stack.enter_context(RedisServer(scratch / "redis")) if "redis" in stores else None
        bench = Bench(data_root, index.patient_ids(), scratch, loads, load, workers, cache_mb, redis)
        others = [s for s in stores if s != "sqlite"]

        def run(engine: str, mix: str, cache: bool = True, record: Path | None = None) -> dict:
            return run_engine(bench, Setup(engine, mix, cache), record)

        runs = {"case-env": run("case-env", "episode", record=scratch / "answers")}
        # the response cache off, once per store, in turns
        uncached = [Setup("case-env", "episode", False, store=store) for store in ["sqlite", *others]]
        runs.update(
            run_paired(bench, uncached) if others else {"case-env/no-cache": run_engine(bench, uncached[0])}
        )
        for baseline in baselines:
            runs[baseline] = run(baseline, "episode")
        # the cheap mix carries the ratio to the floor: its engines in turns (`run_paired`)
        cheap = [Setup("case-env", "cheap"), Setup("case-env", "cheap", False)]
        cheap += [Setup("case-env", "cheap", False, store=store) for store in others]
        runs.update(run_paired(bench, cheap + [Setup(b, "cheap") for b in baselines]))
        # the render mix in turns as well: run one after the other, the ratio of case-env's render to the
        # same render code behind OpenEnv's step ranged 0.59-0.93 over three runs of one commit
        render = [Setup("case-env", "render", False)]
        if "openenv" in baselines:  # the same render code behind OpenEnv's step
            render.append(Setup("openenv", "render"))
        runs.update(run_paired(bench, render))
        if doors:  # each door against the tool API (and OpenEnv's own server) on one worker, in turns
            api = Setup("case-env", workers=DOOR_WORKERS, label="/doors")
            peers = [Setup("openenv", workers=DOOR_WORKERS, label="/doors")] if "openenv" in baselines else []
            runs.update(run_paired(bench, [api, *(Setup(d, workers=DOOR_WORKERS) for d in doors), *peers]))
    ratios = {baseline: ratios_vs(runs, baseline) for baseline in baselines}
    door_ratios = {door: door_vs_api(runs, door) for door in doors}
    store_ratios = store_vs_sqlite(runs)
    result = {
        "benchmark": "server",
        "patients": len(index.patient_ids()),
        "rollouts": rollouts,
        "think_ms": think_ms,
        "group_size": group_size,
        "workers": workers,
        "machine_cpus": os.cpu_count(),
        "baselines": baselines,
        "targets": TARGETS,
        "runs": runs,
        **{f"ratio_vs_{baseline}": r for baseline, r in ratios.items()},
        "doors": door_ratios,
        "stores": store_ratios,
        "met": {**verdict(runs, ratios), **door_verdict(runs, door_ratios), **store_verdict(store_ratios)},
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot(result, out / "bench.png")
    return result


THRESHOLDS = {  # how each target of `verdict` and `door_verdict` reads, with its threshold
    "calls_per_s": f"episode mix >= {TARGETS['calls_per_s']:g} calls/s",
    "render_p99_ms": f"render p99 < {TARGETS['render_p99_ms']:g} ms",
    "text_p99_ms": f"text tools' p99 < {TARGETS['text_p99_ms']:g} ms",
    "zero_errors": "no errors",
    "calls_per_s_no_cache": f"episode mix without the cache >= {TARGETS['calls_per_s_no_cache']:g} calls/s",
    "render_cpu_ms": f"render <= {TARGETS['render_cpu_ms']:g} ms server CPU per call",
    "ratio_throughput": f">= {TARGETS['ratio_throughput']:g}x the naive engine's calls/s",
    "cheap_cpu_vs_floor": f"cheap mix <= {TARGETS['cheap_cpu_vs_floor']:g}x the floor's CPU per call",
    "throughput_vs_openenv": f"every mix, cache off, >= {TARGETS['throughput_vs_openenv']:g}x OpenEnv's calls/s",
    "store_cpu_vs_sqlite": f"Redis <= {TARGETS['store_cpu_vs_sqlite']:g}x SQLite's CPU per call, every mix",
}


def target_lines(met: dict[str, bool]) -> list[str]:
    """One line per target: its threshold and whether this run met it."""
    lines = []
    for key, ok in met.items():
        door = key.removesuffix("_cpu_vs_api")
        said = THRESHOLDS.get(key) or f"{door} <= {TARGETS['door_cpu_vs_api']:g}x the tool API's CPU per call"
        lines.append(f"  {'met   ' if ok else 'MISSED'}  {said}")
    return lines


def _panel(name: str, run: dict) -> str:
    """Which panel of bench.png a run belongs to: its mix, or the doors' comparison on one worker."""
    return "doors, one worker" if name.endswith(("/doors", "-door")) else f"{run['mix']} mix"


def plot(result: dict, path: Path) -> None:
    """One column per mix (and one for the doors): calls per second on top, p99 latency below, each a
    horizontal bar per engine on a linear axis from zero, so names fit and lengths compare."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, dict[str, dict]] = {}
    for name, run in result["runs"].items():
        panels.setdefault(_panel(name, run), {})[name] = run
    fig, axes = plt.subplots(2, len(panels), figsize=(4.4 * len(panels), 6.2), squeeze=False)
    for column, (title, runs) in enumerate(panels.items()):
        names = list(runs)[::-1]  # the first engine on top
        top, bottom = axes[0][column], axes[1][column]
        top.barh(names, [runs[n]["calls_per_s"] for n in names], color="C0")
        top.set_title(title)
        top.set_xlabel("tool calls per second")
        bottom.barh(names, [runs[n]["latency_ms_all"]["p99"] for n in names], color="C1")
        bottom.set_xlabel("p99 latency over all tools (ms)")
        for ax in (top, bottom):
            ax.set_xlim(left=0)
            ax.tick_params(axis="y", labelsize=8)
            ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{result['rollouts']} concurrent rollouts, {result['workers']} worker(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def bench_server(options: ServerBenchOptions, echo: Callable[[str], object]) -> dict:
    """`case-env bench server` for imaging: the engines above under `options.rollouts` rollouts, reported."""
    from case_env.envs.imaging.synth.writer import generate_dataset

    options.refuse("imaging", ("model_latency_ms", "model_failure_rate", "rewards", "judge_latency_ms"))
    if options.runs != 1:
        raise ValueError("the imaging server benchmark runs once per call (its engines already alternate)")
    baselines = parse_baselines(options.baseline)
    doors = parse_doors(options.doors)
    data_root = options.data_root or Path("data/bench")
    out, rollouts, workers = options.out, options.rollouts, options.workers
    if not data_root.is_dir():
        echo(f"{data_root} missing: generating {BENCH_PATIENTS} ci-profile patients (once; reused)")
        generate_dataset(data_root, BENCH_PATIENTS, "ci", 0, jobs=os.cpu_count() or 1)
    result = run_server_bench(
        data_root,
        out,
        rollouts,
        options.duration,
        workers,
        options.warmup,
        baselines,
        options.cache_mb,
        options.think_ms,
        options.group_size,
        doors,
        parse_stores(options.stores),
    )
    progress("")
    for engine, run in result["runs"].items():
        echo(
            f"\n{engine}: {run['calls_per_s']} calls/s, {rollouts} rollouts, {run['workers']} worker(s), "
            f"server CPU {run['server_cpu_cores']} cores ({run['server_cpu_ms_per_call']} ms per call), "
            f"peak RSS {run['server_peak_rss_mb']} MB, errors {run['errors'] or 'none'}, "
            f"load generator CPU {run['load_cpu_ms_per_call']} ms per call"
            + (
                f", response cache answered {run['response_cache_hit_rate']:.0%}"
                if run.get("response_cache_hit_rate") is not None
                else ""
            )
        )
        echo(f"  {'tool':22s} {'n':>7s} {'p50 ms':>8s} {'p95 ms':>8s} {'p99 ms':>8s}")
        for tool, f in {**run["latency_ms"], "all": run["latency_ms_all"]}.items():
            echo(f"  {tool:22s} {f['n']:7d} {f['p50']:8.1f} {f['p95']:8.1f} {f['p99']:8.1f}")
    for name in result["baselines"]:
        for mix, r in result[f"ratio_vs_{name}"].items():
            p99 = round(1 / r["p99"], 2) if r["p99"] else float("inf")
            echo(
                f"{mix} mix: {r['throughput']}x {name}'s calls/s, {p99}x its p99 latency, "
                f"{r['cpu_per_call']}x its server CPU per call"
            )
    for mix, r in result["stores"].items():
        echo(
            f"{mix} with Redis: {r['throughput']}x SQLite's calls/s, {r['cpu_per_call']}x its CPU per call "
            "(server and redis-server)"
        )
    for door, r in result["doors"].items():
        echo(
            f"{door} (one worker): {r['throughput']}x the tool API's calls/s, {r['p99']}x its p99 latency, "
            f"{r['cpu_per_call']}x its server CPU per call"
        )
    met = result["met"]
    echo(f"targets: {sum(met.values())} of {len(met)} met")
    for line in target_lines(met):
        echo(line)
    echo(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")
    return result
