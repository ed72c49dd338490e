"""`case-env bench server`: throughput and per-tool latency of the real server under many concurrent rollouts,
optionally against the naive reference engine in the same run.

Each engine is served by uvicorn in its own process group (same worker count, loopback); the load generator
(`case_env.envs.imaging.bench.load`) runs as a third process. While it runs, this process samples the server's process
tree for CPU time and resident memory. `bench.json` holds every run, the ratios against the naive engine
and which targets were met; `bench.png` plots them.
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
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from case_env.bench.process import ServerProcess, free_port
from case_env.envs.imaging.bench.load import episode_calls
from case_env.envs.imaging.data.index import scan

ENGINES = {
    "case-env": "case_env.server.app:create_app",
    "naive": "case_env.envs.imaging.bench.naive:create_app",
}
RENDER_TOOLS = ("render_slice", "render_comparison")
PROBE_EPISODES = 2  # episodes of the unloaded single-rollout probe after each load
PROBE_LIMIT_S = 120.0

# issue 6: 256 concurrent rollouts on this 2-core machine
TARGETS = {"calls_per_s": 600.0, "render_p99_ms": 250.0, "text_p99_ms": 100.0, "ratio_throughput": 30.0}


@dataclass
class Sampler:
    """CPU seconds and peak memory of a process and its children, sampled on a thread. RSS counts pages
    shared between workers (the mapped decoded volumes) once per worker; PSS splits them fairly."""

    root: psutil.Process
    interval: float = 0.25
    peak_rss: int = 0
    peak_pss: int = 0
    _stop: bool = False

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

    def _run(self) -> None:
        while not self._stop:
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


def run_engine(
    engine: str,
    data_root: Path,
    patients_file: Path,
    scratch: Path,
    rollouts: int,
    duration: float,
    warmup: float,
    workers: int,
    cache_mb: int | None,
    think_ms: float = 0.0,
    group_size: int = 1,
) -> dict:
    port = free_port()
    env = {
        "CASE_ENV_DATA_ROOT": str(data_root),
        "CASE_ENV_CACHE_DIR": str(scratch / "cache"),
        "CASE_ENV_EPISODE_DB": str(scratch / f"episodes-{engine}.sqlite"),
        "PROMETHEUS_MULTIPROC_DIR": str(scratch / f"metrics-{engine}"),
        "CASE_ENV_TOKEN": None,
        "CASE_ENV_AUDIT_LOG": None,
    }
    if cache_mb is not None:
        env["CASE_ENV_CACHE_BYTES"] = str(cache_mb * 2**20)
    (scratch / f"metrics-{engine}").mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        ENGINES[engine],
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    with ServerProcess(scratch / f"server-{engine}.log", env, port=port, command=command) as server:
        url = server.url
        with Sampler(psutil.Process(server.pid)) as sampler:
            cpu_before, started = sampler.cpu_seconds(), time.perf_counter()
            result = _load(
                url,
                patients_file,
                scratch / f"load-{engine}.json",
                rollouts,
                duration,
                warmup,
                think_ms,
                group_size=group_size,
            )
            cpu_after, elapsed = sampler.cpu_seconds(), time.perf_counter() - started
        # one rollout alone, once the backlog has drained: each tool's service time without queueing
        _drain(url)
        probe = _load(
            url,
            patients_file,
            scratch / f"probe-{engine}.json",
            1,
            PROBE_LIMIT_S,
            0.0,
            0.0,
            episodes=PROBE_EPISODES,
        )
    result.update(
        {
            "engine": engine,
            "workers": workers,
            "server_cpu_cores": round((cpu_after - cpu_before) / elapsed, 2),
            "server_peak_rss_mb": round(sampler.peak_rss / 2**20, 1),
            "server_peak_pss_mb": round(sampler.peak_pss / 2**20, 1),
            "unloaded_ms": {tool: f["mean"] for tool, f in probe["latency_ms"].items()},
            "unloaded_episode_ms": _episode_ms(probe),
        }
    )
    return result


def _load(
    url: str,
    patients_file: Path,
    out: Path,
    rollouts: int,
    duration: float,
    warmup: float,
    think_ms: float,
    episodes: int | None = None,
    group_size: int = 1,
) -> dict:
    command = [
        sys.executable,
        "-m",
        "case_env.envs.imaging.bench.load",
        url,
        str(patients_file),
        str(out),
        "--rollouts",
        str(rollouts),
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
        "--think-ms",
        str(think_ms),
    ]
    if episodes is not None:
        command += ["--episodes", str(episodes)]
    command += ["--group-size", str(group_size)]
    load = subprocess.run(command, capture_output=True, text=True)
    if load.returncode != 0:
        raise RuntimeError(f"load generator failed: {load.stderr[-2000:]}")
    return json.loads(out.read_text())


def _drain(url: str, limit_s: float = 60.0) -> None:
    """Wait until no call is in flight (the naive engine keeps working through its backlog after a load)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        in_flight = sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("case_env_calls_in_flight")
        )
        if in_flight == 0:
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


def verdict(fast: dict, naive: dict | None) -> dict:
    checks = {
        "calls_per_s": fast["calls_per_s"] >= TARGETS["calls_per_s"],
        "render_p99_ms": _worst_p99(fast, RENDER_TOOLS, True) < TARGETS["render_p99_ms"],
        "text_p99_ms": _worst_p99(fast, RENDER_TOOLS, False) < TARGETS["text_p99_ms"],
        "zero_errors": not fast["errors"],
    }
    if naive is not None:
        checks["ratio_throughput"] = (
            _ratio(fast["calls_per_s"], naive["calls_per_s"]) >= TARGETS["ratio_throughput"]
        )
    return checks


def _ratio(a: float, b: float) -> float:
    return round(a / b, 1) if b else float("inf")


def run_server_bench(
    data_root: Path,
    out: Path,
    rollouts: int,
    duration: float,
    workers: int,
    warmup: float,
    baseline: str | None = None,
    cache_mb: int | None = None,
    think_ms: float = 0.0,
    group_size: int = 1,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    index = scan(data_root)
    with tempfile.TemporaryDirectory(prefix="case-env-bench-") as tmp:
        scratch = Path(tmp)
        patients_file = scratch / "patients.txt"
        patients_file.write_text("".join(f"{p}\n" for p in index.patient_ids()))
        engines = ["case-env", *([baseline] if baseline else [])]
        args = (
            data_root,
            patients_file,
            scratch,
            rollouts,
            duration,
            warmup,
            workers,
            cache_mb,
            think_ms,
            group_size,
        )
        runs = {engine: run_engine(engine, *args) for engine in engines}
    fast, naive = runs["case-env"], runs.get("naive")
    result = {
        "benchmark": "server",
        "patients": len(index.patient_ids()),
        "rollouts": rollouts,
        "think_ms": think_ms,
        "group_size": group_size,
        "workers": workers,
        "machine_cpus": os.cpu_count(),
        "targets": TARGETS,
        "runs": runs,
        "met": verdict(fast, naive),
    }
    if naive is not None:
        result["ratio_vs_naive"] = {
            "throughput": _ratio(fast["calls_per_s"], naive["calls_per_s"]),
            "p99": _ratio(naive["latency_ms_all"]["p99"], fast["latency_ms_all"]["p99"]),
            "unloaded_episode": _ratio(naive["unloaded_episode_ms"] or 0, fast["unloaded_episode_ms"] or 0),
        }
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot(result, out / "bench.png")
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar(list(runs), [r["calls_per_s"] for r in runs.values()], color=["#2a7", "#c54"][: len(runs)])
    left.set_ylabel("tool calls per second")
    left.set_yscale("log")
    left.set_title(f"{result['rollouts']} concurrent rollouts, {result['workers']} worker(s)")
    tools = sorted(runs["case-env"]["latency_ms"])
    width = 0.8 / len(runs)
    for k, (engine, run) in enumerate(runs.items()):
        right.bar(
            [i + k * width for i in range(len(tools))],
            [run["latency_ms"].get(t, {}).get("p99", 0) for t in tools],
            width,
            label=engine,
        )
    right.set_xticks(
        [i + width * (len(runs) - 1) / 2 for i in range(len(tools))], tools, rotation=30, ha="right"
    )
    right.set_yscale("log")
    right.set_ylabel("p99 latency (ms)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
