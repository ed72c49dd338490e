"""Check 7: soak. Tens of thousands of calls over many patients against one server process whose caches
are far smaller than the data, so volumes and answers are evicted and reloaded all the time.

Sampled throughout: the server's resident memory, its open file descriptors and its live episodes. Memory
must stay within what the settings allow (decoded-volume cache + response cache) plus a fixed margin over
the process at rest, and must not keep climbing in the second half; descriptors must come back to where
they started; live episodes must stay near their cap (they are trimmed by the periodic sweep).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time

import httpx
import psutil

from case_env.bench.load import run_load
from case_env.bench.process import ServerProcess
from case_env.envs.imaging.data.index import scan
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.synth.writer import generate_dataset
from tests.reliability.conftest import SCALE, size

MB = 2**20
CACHE_MB = 64  # about two ci patients of decoded volumes
RESPONSE_CACHE_MB = 8
MAX_EPISODES = 100
IDLE_S = 8.0  # the sweep runs every idle/4 = 2 s
MARGIN_MB = 150  # allocator slack, thread stacks, pools: measured peak overshoot is reported as a figure
ROLLOUTS = 16
CALLS_PER_EPISODE = 9


class Sampler(threading.Thread):
    def __init__(self, pid: int, url: str):
        super().__init__(daemon=True)
        self.process, self.url = psutil.Process(pid), url
        self.samples: list[tuple[float, int, int, float]] = []  # (time, rss, fds, live episodes)
        self.stopped = threading.Event()

    def sample(self) -> tuple[float, int, int, float]:
        live = float("nan")
        with contextlib.suppress(httpx.HTTPError):
            for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
                if line.startswith("case_env_episodes_live"):
                    live = float(line.split()[-1])
        return time.monotonic(), self.process.memory_info().rss, self.process.num_fds(), live

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            self.samples.append(self.sample())


def _many_patients(dataset, tmp_path):
    if SCALE != "full":
        return dataset
    root = tmp_path / "many"
    generate_dataset(root, 40, "ci", 23, jobs=os.cpu_count() or 1)
    return root


def _smallest_volume(root, patient: str) -> int:
    store = PatientStore(root)
    visit = store.patient(patient).visits[0]
    return min(store.image(patient, visit.visit, channel).nbytes for channel in visit.channels)


def test_soak(dataset, tmp_path, figures):
    root = _many_patients(dataset, tmp_path)
    patients = scan(root).patient_ids()
    target = size(ci=3000, full=50_000)
    episodes = math.ceil(target / CALLS_PER_EPISODE / ROLLOUTS)
    env = {
        "CASE_ENV_DATA_ROOT": str(root),
        "CASE_ENV_CACHE_DIR": str(tmp_path / "cache"),
        "CASE_ENV_CACHE_BYTES": str(CACHE_MB * MB),
        "CASE_ENV_RESPONSE_CACHE_MB": str(RESPONSE_CACHE_MB),
        "CASE_ENV_MAX_EPISODES": str(MAX_EPISODES),
        "CASE_ENV_EPISODE_IDLE_S": str(IDLE_S),
        "CASE_ENV_TOKEN": None,
        "CASE_ENV_AUDIT_LOG": None,
    }
    with ServerProcess(tmp_path / "server.log", env) as server:
        # at rest: started, every tool imported and run once, nothing of the soak cached yet
        asyncio.run(run_load(server.url, patients[:1], 1, 600, 0.0, seed=1, episodes=1))
        sampler = Sampler(server.pid, server.url)
        _, rest_rss, rest_fds, _ = sampler.sample()
        sampler.start()
        result = asyncio.run(run_load(server.url, patients, ROLLOUTS, 3600, 0.0, seed=7, episodes=episodes))
        time.sleep(2 * IDLE_S / 4 + 0.5)  # one more sweep, and the load's connections closed
        sampler.stopped.set()
        sampler.join()
        _, end_rss, end_fds, end_live = sampler.sample()
    samples = sampler.samples
    rss = [s[1] for s in samples]
    half = len(rss) // 2
    live = [s[3] for s in samples if s[3] == s[3]]
    rate = result["calls"] / result["duration_s"]
    allowed_rss = rest_rss + (CACHE_MB + RESPONSE_CACHE_MB + MARGIN_MB) * MB
    # the cap, plus the episodes two sweep intervals can start: the sweep is a task on the server's event
    # loop and runs up to an interval late when the loop is busy (a CI run peaked at 183 against a bound of
    # one and a half intervals, 182.96)
    live_bound = MAX_EPISODES + rate / CALLS_PER_EPISODE * (IDLE_S / 4) * 2
    figures.update(
        {
            "calls": result["calls"],
            "errors": result["errors"],
            "calls_per_s": round(rate, 1),
            "patients": len(patients),
            "cache_budget_mb": CACHE_MB,
            "response_cache_mb": RESPONSE_CACHE_MB,
            "rss_start_mb": round(rest_rss / MB, 1),
            "rss_peak_mb": round(max(rss) / MB, 1),
            "rss_end_mb": round(end_rss / MB, 1),
            "rss_allowed_mb": round(allowed_rss / MB, 1),
            "rss_growth_second_half_mb": round((max(rss[half:]) - max(rss[:half])) / MB, 1),
            "fds_start": rest_fds,
            "fds_peak": max(s[2] for s in samples),
            "fds_end": end_fds,
            "fds_allowed": rest_fds + CACHE_MB * MB // _smallest_volume(root, patients[0]) + 4,
            "episodes_live_peak": max(live),
            "episodes_live_end": end_live,
            "episodes_cap": MAX_EPISODES,
            "episodes_started": ROLLOUTS * episodes,
        }
    )
    assert result["calls"] >= target * 0.95 and not result["errors"], result["errors"]
    assert max(rss) <= allowed_rss
    assert figures["rss_growth_second_half_mb"] <= 32  # flat once the caches are full: no leak
    # descriptors: one per memory-mapped volume in the cache (CPython's mmap keeps one), bounded by the cache
    # budget, plus a few; none left behind by the load's connections
    assert end_fds <= figures["fds_allowed"]
    assert max(live) <= live_bound and end_live <= MAX_EPISODES
    assert ROLLOUTS * episodes > 3 * MAX_EPISODES  # the cap was really exercised
