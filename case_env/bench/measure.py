"""What the benchmarks measure with: CPU and memory of a server's process tree, the page cache filled before a
run, and one result from several turns of the load generator.

A server's figures are its process tree's (uvicorn's supervisor and workers), sampled from this process, so
the load generator's own CPU is never counted as the server's.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass
class Sampler:
    """CPU seconds and peak memory of a process and its children, sampled on a thread. RSS counts pages
    shared between workers (the mapped decoded volumes) once per worker; PSS splits them fairly."""

    root: psutil.Process
    interval: float = 0.25
    # processes whose CPU counts as the server's too, without their children (the Redis its episodes live in)
    extra: list[psutil.Process] = field(default_factory=list)
    peak_rss: int = 0
    peak_pss: int = 0
    _stop: bool = False
    samples: list[tuple[float, float]] = field(default_factory=list)  # (wall time, CPU seconds)

    def _tree(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True), *self.extra]
        except psutil.NoSuchProcess:
            return list(self.extra)

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

    def note_memory(self) -> None:
        """Sample the tree's RSS and PSS into the peaks."""
        rss = pss = 0
        for proc in self._tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                full = proc.memory_full_info()
                rss, pss = rss + full.rss, pss + full.pss
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)

    def _run(self) -> None:
        while not self._stop:
            self.samples.append((time.time(), self.cpu_seconds()))
            self.note_memory()
            time.sleep(self.interval)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join()


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


def merged_turns(turns: list[dict], rollouts: int) -> dict:
    """One result from the load generator's results of several turns: calls, time and errors summed, the
    load generator's CPU per call weighted by calls, each latency percentile the median of the turns'."""
    calls = sum(t["calls"] for t in turns)
    duration = sum(t["duration_s"] for t in turns)
    errors: dict[str, int] = {}
    for t in turns:
        for kind, n in t["errors"].items():
            errors[kind] = errors.get(kind, 0) + n

    def median_figures(per_turn: list[dict]) -> dict:
        if not per_turn:
            return {
                "n": 0,
                "p50": float("nan"),
                "p95": float("nan"),
                "p99": float("nan"),
                "mean": float("nan"),
            }
        merged = {"n": sum(f["n"] for f in per_turn)}
        for key in ("p50", "p95", "p99", "mean"):
            merged[key] = round(statistics.median(f[key] for f in per_turn), 1)
        return merged

    tools = sorted({tool for t in turns for tool in t["latency_ms"]})
    return {
        "rollouts": rollouts,
        "duration_s": round(duration, 2),
        "calls": calls,
        "calls_per_s": round(calls / duration, 1) if duration else 0.0,
        "errors": dict(sorted(errors.items())),
        "latency_ms": {
            tool: median_figures([t["latency_ms"][tool] for t in turns if tool in t["latency_ms"]])
            for tool in tools
        },
        "latency_ms_all": median_figures([t["latency_ms_all"] for t in turns]),
        "load_cpu_ms_per_call": round(
            sum(t["load_cpu_ms_per_call"] * t["calls"] for t in turns) / max(calls, 1), 3
        ),
    }
