"""`case-env bench server`: throughput, per-tool latency and server CPU per call of the real server under
many concurrent rollouts, against peers and floors in the same run.

Baselines (`--baseline naive,openenv,floor`, any subset):
- `naive`: the same app over a naive data engine (`naive.py`): what the engine buys.
- `openenv`: the same tools through OpenEnv's own app factory (`openenv_engine.py`, the `openenv` extra).
- `floor`: a bare Starlette route replaying the answers case-env gave earlier in the run (`floor.py`).

Each engine is served by uvicorn in its own process group (same worker count, loopback) and driven by the
load generator (`case_env.envs.imaging.bench.load`) as a separate process, twice: the episode mix (a whole
imaging episode, renders included) and the cheap mix (`list_visits` only, the framework's own cost).
case-env runs both mixes with its response cache on and off. While a load runs, this process samples the
server's process tree for CPU time and memory, so each run reports server CPU per call over exactly the
measured window. `bench.json` holds every run, `ratio_vs_<baseline>` per mix (throughput and server CPU per
call as case-env ÷ baseline, p99 as baseline ÷ case-env), the response cache's hit rate and which targets
were met; `bench.png` plots them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from case_env.bench.process import ServerProcess, free_port
from case_env.envs.imaging.bench.load import episode_calls
from case_env.envs.imaging.data.index import scan
from case_env.server.http import PROTOCOL as HTTP_PROTOCOL
from case_env.settings import DataSettings

ENGINES = {
    "case-env": "case_env.server.app:create_app",
    "naive": "case_env.envs.imaging.bench.naive:create_app",
    "openenv": "case_env.envs.imaging.bench.openenv_engine:create_app",
    "floor": "case_env.envs.imaging.bench.floor:create_app",
}
BASELINES = ("naive", "openenv", "floor")
PROTOCOL = {"openenv": "openenv"}  # the load generator speaks case-env's protocol to the others
# the engines served by case-env's app as `case-env serve` runs it: its /metrics, its HTTP protocol
CASE_ENV_APPS = ("case-env", "naive")
MIXES = ("episode", "cheap", "render")
RENDER_TOOLS = ("render_slice", "render_comparison")
BENCH_PATIENTS = 48  # the default dataset: enough patients that the response cache is not the headline
PROBE_EPISODES = 2  # episodes of the unloaded single-rollout probe after each load
PROBE_LIMIT_S = 120.0

# issue 6: 256 concurrent rollouts on this 2-core machine; issue 19: the cheap call within 2x the floor's
# server CPU, 1,500 calls/s with the response cache off
TARGETS = {
    "calls_per_s": 600.0,
    "render_p99_ms": 250.0,
    "text_p99_ms": 100.0,
    "ratio_throughput": 30.0,
    "cheap_cpu_vs_floor": 2.0,
    "calls_per_s_no_cache": 1500.0,
    "render_cpu_ms": 1.5,
}


@dataclass
class Sampler:
    """CPU seconds and peak memory of a process and its children, sampled on a thread. RSS counts pages
    shared between workers (the mapped decoded volumes) once per worker; PSS splits them fairly."""

    root: psutil.Process
    interval: float = 0.25
    peak_rss: int = 0
    peak_pss: int = 0
    _stop: bool = False
    samples: list[tuple[float, float]] = field(default_factory=list)  # (wall time, CPU seconds)

    def _tree(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        total = 0.0
        for proc in self._tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def cpu_between(self, start: float, end: float) -> float:
        """CPU seconds the tree spent between two wall times, from the samples nearest each."""

        def at(moment: float) -> float:
            return min(self.samples, key=lambda sample: abs(sample[0] - moment))[1]

        return at(end) - at(start) if self.samples else 0.0

    def _run(self) -> None:
        while not self._stop:
            self.samples.append((time.time(), self.cpu_seconds()))
            rss = pss = 0
            for proc in self._tree():
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    full = proc.memory_full_info()
                    rss, pss = rss + full.rss, pss + full.pss
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            time.sleep(self.interval)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join()


@dataclass(frozen=True)
class Load:
    """What one engine run asks of the load generator."""

    rollouts: int
    duration: float
    warmup: float
    think_ms: float = 0.0
    group_size: int = 1


def run_engine(
    engine: str,
    data_root: Path,
    patients_file: Path,
    scratch: Path,
    load: Load,
    workers: int,
    cache_mb: int | None,
    mix: str = "episode",
    response_cache: bool = True,
    record: Path | None = None,
) -> dict:
    """One engine under one load: its figures, server CPU per call over the measured window and (case-env)
    how its response cache answered. `record` keeps each tool's first answer for the floor."""
    cache_dir = DataSettings(data_root=data_root).cache_dir
    page_in([data_root, cache_dir / "decoded", cache_dir / "derived"])
    port = free_port()
    tag = f"{engine}-{mix}-{'cache' if response_cache else 'nocache'}"
    env = {
        "CASE_ENV_DATA_ROOT": str(data_root),
        "CASE_ENV_CACHE_DIR": str(cache_dir),  # decoded once, for every run
        "CASE_ENV_EPISODE_DB": str(scratch / f"episodes-{tag}.sqlite"),
        # as `case-env serve --workers N` sets it: each worker sizes its render pool to cores / workers
        "CASE_ENV_WORKERS": str(workers),
        "PROMETHEUS_MULTIPROC_DIR": str(scratch / f"metrics-{tag}"),
        "CASE_ENV_TOKEN": None,
        "CASE_ENV_AUDIT_LOG": None,
        "CASE_ENV_FLOOR_ANSWERS": str(scratch / "answers"),
    }
    if not response_cache:
        env["CASE_ENV_RESPONSE_CACHE_MB"] = "0"
    if cache_mb is not None:
        env["CASE_ENV_CACHE_BYTES"] = str(cache_mb * 2**20)
    (scratch / f"metrics-{tag}").mkdir(parents=True, exist_ok=True)
    command = [
        *(sys.executable, "-m", "uvicorn", ENGINES[engine], "--factory", "--host", "127.0.0.1"),
        *("--port", str(port), "--workers", str(workers), "--log-level", "warning", "--no-access-log"),
    ]
    if engine in CASE_ENV_APPS:
        command += ["--http", HTTP_PROTOCOL]
    protocol = PROTOCOL.get(engine, "case-env")
    with ServerProcess(scratch / f"server-{tag}.log", env, port=port, command=command) as server:
        url = server.url
        with Sampler(psutil.Process(server.pid)) as sampler:
            result = _load(url, patients_file, scratch / f"load-{tag}.json", load, mix, protocol, record)
        cpu = sampler.cpu_between(*result["window"])
        ours = engine in CASE_ENV_APPS
        cache = (_response_cache(url) if response_cache else 0.0) if ours else None
        # one rollout alone, once the backlog has drained: each tool's service time without queueing
        if ours:
            _drain(url)
        probe = _load(
            url, patients_file, scratch / f"probe-{tag}.json", PROBE, mix, protocol, None, PROBE_EPISODES
        )
    calls = max(result["calls"], 1)
    result.update(
        {
            "engine": engine,
            "mix": mix,
            "response_cache": response_cache,
            "workers": workers,
            "server_cpu_cores": round(cpu / result["duration_s"], 2),
            "server_cpu_ms_per_call": round(1000 * cpu / calls, 3),
            "server_peak_rss_mb": round(sampler.peak_rss / 2**20, 1),
            "server_peak_pss_mb": round(sampler.peak_pss / 2**20, 1),
            "unloaded_ms": {tool: f["mean"] for tool, f in probe["latency_ms"].items()},
            "unloaded_episode_ms": _episode_ms(probe) if mix == "episode" else None,
        }
    )
    if cache is not None:
        result["response_cache_hit_rate"] = cache
    return result


PROBE = Load(1, PROBE_LIMIT_S, 0.0)


def page_in(directories: list[Path]) -> int:
    """Read every file under the directories once, so each run starts with the data in the page cache.
    Machines that reclaim idle page cache (this VM's kernel pages out what was not touched for a minute, by
    DAMON) would otherwise give a run that follows the cheap mix its data from disk, and the figures of a run
    would depend on the runs before it; returns the bytes read."""
    buffer, total = bytearray(1 << 20), 0
    for directory in directories:
        for path in sorted(directory.rglob("*")) if directory.is_dir() else []:
            with contextlib.suppress(OSError), path.open("rb", buffering=0) as handle:
                while read := handle.readinto(buffer):
                    total += read
    return total


def _load(
    url: str,
    patients_file: Path,
    out: Path,
    load: Load,
    mix: str,
    protocol: str,
    record: Path | None,
    episodes: int | None = None,
) -> dict:
    command = [
        *(sys.executable, "-m", "case_env.envs.imaging.bench.load", url, str(patients_file), str(out)),
        *("--rollouts", str(load.rollouts), "--duration", str(load.duration), "--warmup", str(load.warmup)),
        *("--think-ms", str(load.think_ms), "--group-size", str(load.group_size)),
        *("--mix", mix, "--protocol", protocol),
    ]
    if episodes is not None:
        command += ["--episodes", str(episodes)]
    if record is not None:
        command += ["--record", str(record)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr[-2000:]}")
    return json.loads(out.read_text())


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
    return checks


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("inf")


def ratios_vs(runs: dict[str, dict], baseline: str) -> dict:
    """case-env against one baseline, mix by mix (and case-env's no-cache runs against the same mix)."""
    out = {}
    for name, run in runs.items():
        if run["engine"] != "case-env":
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

    store = registry.get("imaging").open_store(DataSettings(data_root=data_root))
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
        try:
            import openenv.core.env_server.http_server  # noqa: F401
        except ImportError as exc:
            raise ValueError(
                f"the openenv baseline needs openenv-core ({exc}); install the extra: pip install 'case-env[openenv]'"
            ) from exc
    return list(dict.fromkeys(chosen))


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
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    baselines = baselines or []
    index = scan(data_root)
    load = Load(rollouts, duration, warmup, think_ms, group_size)
    _decode_once(data_root, index.patient_ids())
    with tempfile.TemporaryDirectory(prefix="case-env-bench-") as tmp:
        scratch = Path(tmp)
        patients_file = scratch / "patients.txt"
        patients_file.write_text("".join(f"{p}\n" for p in index.patient_ids()))

        def run(engine: str, mix: str, cache: bool = True, record: Path | None = None) -> dict:
            return run_engine(
                engine, data_root, patients_file, scratch, load, workers, cache_mb, mix, cache, record
            )

        # mix by mix, each baseline next to the case-env runs it is compared with, the floor's cheap run
        # between case-env's two: this machine's speed drifts by tens of percent over minutes, and a ratio of
        # runs minutes apart measured the drift (the floor once ran 30 % cheaper at the end of a run)
        floor_first = [b for b in baselines if b == "floor"]
        others = [b for b in baselines if b != "floor"]
        runs = {"case-env": run("case-env", "episode", record=scratch / "answers")}
        runs["case-env/no-cache"] = run("case-env", "episode", cache=False)
        for baseline in floor_first + others:
            runs[baseline] = run(baseline, "episode")
        runs["case-env/cheap"] = run("case-env", "cheap")
        for baseline in floor_first:
            runs[f"{baseline}/cheap"] = run(baseline, "cheap")
        runs["case-env/cheap/no-cache"] = run("case-env", "cheap", cache=False)
        for baseline in others:
            runs[f"{baseline}/cheap"] = run(baseline, "cheap")
        runs["case-env/render/no-cache"] = run("case-env", "render", cache=False)
        if "openenv" in baselines:  # the same render code behind OpenEnv's step
            runs["openenv/render"] = run("openenv", "render")
    ratios = {baseline: ratios_vs(runs, baseline) for baseline in baselines}
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
        "met": verdict(runs, ratios),
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot(result, out / "bench.png")
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    left.bar(list(runs), [r["calls_per_s"] for r in runs.values()])
    left.set_ylabel("tool calls per second")
    left.set_yscale("log")
    left.tick_params(axis="x", labelrotation=45)
    left.set_title(f"{result['rollouts']} concurrent rollouts, {result['workers']} worker(s)")
    episode = {name: run for name, run in runs.items() if run["mix"] == "episode"}
    tools = sorted(runs["case-env"]["latency_ms"])
    width = 0.8 / len(episode)
    for k, (name, run) in enumerate(episode.items()):
        right.bar(
            [i + k * width for i in range(len(tools))],
            [run["latency_ms"].get(t, {}).get("p99", 0) for t in tools],
            width,
            label=name,
        )
    right.set_xticks(
        [i + width * (len(episode) - 1) / 2 for i in range(len(tools))], tools, rotation=30, ha="right"
    )
    right.set_yscale("log")
    right.set_ylabel("p99 latency (ms)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
