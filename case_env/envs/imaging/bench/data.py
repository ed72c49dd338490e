"""`case-env bench data`: what the data layer costs, measured in one run on this machine.

Figures: generation time per visit for each profile; first-touch load of a visit (four channels and the
label map, decoded from `.nii.gz`); slice extraction from the cache on each axis (what a renderer does);
and peak RSS of a fresh process that touches every volume under a cache budget smaller than the data.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from case_env.envs.imaging.data.memory import release_freed_memory_promptly
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.scan_protocol import CHANNELS
from case_env.envs.imaging.settings import ImagingSettings
from case_env.envs.imaging.synth.writer import generate_dataset


def _status_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process. ru_maxrss is no use in a spawned child: Linux carries
    the forking parent's peak across exec into it."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _touch_all(store: PatientStore) -> None:
    for pid in store.patient_ids():
        for vf in store.patient(pid).visits:
            for channel in CHANNELS:
                store.image(pid, vf.visit, channel)
            store.organ_labels(pid, vf.visit)


def _memory_probe(root: str, budget_bytes: int, cache_dir: str) -> dict:
    """Runs in a fresh process: peak RSS while touching every volume twice under the budget."""
    settings = ImagingSettings(data_root=Path(root), cache_bytes=budget_bytes, cache_dir=Path(cache_dir))
    store = PatientStore(settings=settings)
    release_freed_memory_promptly()
    baseline = _status_mb("VmRSS")
    for _ in range(2):
        _touch_all(store)
    stats = store.cache.stats()
    peak = _status_mb("VmHWM")
    return {
        "baseline_rss_mb": round(baseline, 1),
        "peak_rss_mb": round(peak, 1),
        "peak_over_baseline_mb": round(peak - baseline, 1),
        "cache_budget_mb": round(budget_bytes / 2**20, 1),
        "cache_bytes_mb_at_end": round(stats.bytes / 2**20, 1),
        "cache_evictions": stats.evictions,
    }


def _slice_timings(store: PatientStore, pid: str, visit: str, repeats: int = 200) -> dict[str, float]:
    data = store.image(pid, visit, "water").data
    rng = np.random.default_rng(0)
    out = {}
    for axis, name in enumerate(("sagittal", "coronal", "axial")):
        picks = rng.integers(0, data.shape[axis], repeats)
        times = []
        for k in picks:
            t = time.perf_counter()
            index = [slice(None)] * 3
            index[axis] = int(k)
            np.ascontiguousarray(data[tuple(index)])
            times.append(time.perf_counter() - t)
        out[name] = round(statistics.median(times) * 1e6, 1)
    return out


def _patient_first_touch(root: Path, cache_dir: Path) -> dict:
    """A whole patient (every channel and label map of both visits): decoded one volume after another, decoded
    by `preload` in parallel (writing the shared decoded files), and mapped from those files by a fresh store,
    as a second worker or a restarted server finds them. Median over the patients."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    figures: dict[str, list[float]] = {"sequential": [], "preload": [], "mapped": []}
    for name, decoded_bytes in (("sequential", 0), ("preload", 64 * 2**30), ("mapped", 64 * 2**30)):
        settings = ImagingSettings(
            data_root=root, cache_bytes=64 * 2**30, cache_dir=cache_dir, decoded_bytes=decoded_bytes
        )
        store = PatientStore(settings=settings)
        for pid in store.patient_ids():
            t = time.perf_counter()
            if name == "sequential":
                store.preload(pid, threads=1)
            else:
                store.preload(pid)
            figures[name].append(time.perf_counter() - t)
    shutil.rmtree(cache_dir, ignore_errors=True)
    return {name: round(statistics.median(values), 3) for name, values in figures.items()}


def bench_profile(out: Path, profile: str, patients: int, cache_mb: int) -> dict:
    root = out / profile
    start = time.perf_counter()
    summaries, _ = generate_dataset(root, patients, profile, seed=0, force=True, jobs=1)
    generation_total = time.perf_counter() - start
    per_visit = [t for s in summaries for t in s.seconds_per_visit]

    settings = ImagingSettings(
        data_root=root, cache_bytes=8 * 2**30, cache_dir=out / "cache", decoded_bytes=0
    )
    store = PatientStore(settings=settings)
    first_touch = []
    for pid in store.patient_ids():
        for vf in store.patient(pid).visits:
            t = time.perf_counter()
            for channel in CHANNELS:
                store.image(pid, vf.visit, channel)
            store.organ_labels(pid, vf.visit)
            first_touch.append(time.perf_counter() - t)
    patient_touch = _patient_first_touch(root, out / f"touch-{profile}")
    pid = store.patient_ids()[0]
    slices = _slice_timings(store, pid, "baseline")
    visit_bytes = sum(store.image(pid, "baseline", c).nbytes for c in CHANNELS)
    visit_bytes += store.organ_labels(pid, "baseline").nbytes
    total_bytes = visit_bytes * sum(len(store.patient(p).visits) for p in store.patient_ids())

    budget = min(cache_mb * 2**20, max(visit_bytes, total_bytes // 2))  # smaller than the data: eviction runs
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        memory = pool.apply(_memory_probe, (str(root), budget, str(out / "cache")))
    return {
        "profile": profile,
        "patients": patients,
        "generation_s_per_visit": {
            "median": round(statistics.median(per_visit), 3),
            "max": round(max(per_visit), 3),
            "total_s": round(generation_total, 2),
        },
        "first_touch_s_per_visit": {
            "median": round(statistics.median(first_touch), 3),
            "max": round(max(first_touch), 3),
            "volumes_per_visit": len(CHANNELS) + 1,
        },
        "first_touch_s_per_patient": patient_touch,
        "slice_from_cache_us": slices,
        "decoded_mb_per_visit": round(visit_bytes / 2**20, 1),
        "decoded_mb_all": round(total_bytes / 2**20, 1),
        "memory": memory,
    }


def run_data_bench(out: Path, patients: int, profiles: list[str], cache_mb: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "data",
        "machine": {"cpus": multiprocessing.cpu_count()},
        "profiles": {p: bench_profile(out, p, patients, cache_mb) for p in profiles},
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result
