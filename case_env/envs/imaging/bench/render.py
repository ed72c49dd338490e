"""Where an uncached `render_slice` spends its CPU, in one process and one thread, against its floor.

    case-env bench render --data-root data/bench --calls 400 --repeats 7

Plays the render mix of `case-env bench server` (random visit, sequence, plane and position, a third with
the organ overlay) straight through the tool, with no server around it, and reports the CPU per render of:
the tool as shipped; the tool with zlib instead of ISA-L, then also with Pillow's resize instead of OpenCV's (the
pipeline before the fast paths of those two steps); the floor, which is deflating the same filtered
rows and nothing else; and what the server's hand-off to its render thread costs by itself (an event loop
submitting a job that sleeps 1 ms to a one-thread pool and awaiting it, CPU of the whole process per hop:
on a VM, waking a thread that went idle is far from free). Figures are the least of `--repeats` passes
(the machine is noisy; the least is the run that was disturbed least) and ratios are taken within this
one run.
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

from case_env.core import registry
from case_env.core.errors import CommandError
from case_env.envs.imaging.bench.mixes import MIXES
from case_env.envs.imaging.settings import ImagingSettings
from case_env.envs.imaging.viewer import render


def _pillow_resize(u8: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return np.array(Image.fromarray(np.ascontiguousarray(u8)).resize(size, Image.BILINEAR))


@contextmanager
def _swapped(**steps):
    before = {name: getattr(render, name) for name in steps}
    for name, value in steps.items():
        setattr(render, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(render, name, value)


def _least_ms(passes: int, job, count: int) -> float:
    best = float("inf")
    for _ in range(passes):
        started = time.thread_time()
        job()
        best = min(best, time.thread_time() - started)
    return 1000 * best / count


def _hop_ms(hops: int = 2000) -> float:
    """Process CPU per hand-off of a job from the event loop to a pool thread and back, as the server
    dispatches a render (the job itself sleeps, so it costs nothing)."""

    async def hand_off(pool: ThreadPoolExecutor) -> float:
        started = time.process_time()
        for _ in range(hops):
            await asyncio.wait_for(asyncio.wrap_future(pool.submit(time.sleep, 0.001)), 20)
        return 1000 * (time.process_time() - started) / hops

    with ThreadPoolExecutor(1) as pool:
        return asyncio.run(hand_off(pool))


def run_render_bench(data_root: Path, calls_wanted: int = 400, repeats: int = 7, seed: int = 0) -> dict:
    """The figures (CPU ms per render of each variant, the floors, the hop, their ratios)."""
    env = registry.get("imaging")
    store = env.open_cases(ImagingSettings(data_root=data_root))
    patients = store.ids()
    if not patients:
        raise CommandError(f"no patients under {data_root} (`case-env bench server` generates 48 there)", 2)
    for patient in patients:
        store.patients.preload(patient)  # decoding is the data benchmark's subject, not this one's
    rng = random.Random(seed)
    calls = []
    while len(calls) < calls_wanted:
        patient = rng.choice(patients)
        calls += [(patient, arguments) for _, arguments in MIXES["render"](rng)]
    calls = calls[:calls_wanted]
    spec = env.tools["render_slice"]
    contexts = {p: env.tool_context(store, p, None) for p in patients}
    rows: list[bytes] = []

    def tool() -> None:
        for patient, arguments in calls:
            spec.run(contexts[patient], spec.parse(arguments))

    class Recording:  # the deflate as shipped, keeping what it was given for the floor
        @staticmethod
        def compress(data: bytes, level: int) -> bytes:
            rows.append(data)
            return shipped.compress(data, level)

    shipped = render.deflate
    with _swapped(deflate=Recording):
        tool()  # warms the windows and extents, and records what the floor deflates
    figures = {
        "calls": len(calls),
        "deflate": shipped.__name__,
        "render_ms": _least_ms(repeats, tool, len(calls)),
    }
    with _swapped(deflate=zlib):
        figures["render_zlib_ms"] = _least_ms(repeats, tool, len(calls))
    with _swapped(deflate=zlib, resize=_pillow_resize):
        figures["render_zlib_pillow_ms"] = _least_ms(repeats, tool, len(calls))

    def floor(compress) -> None:
        for data in rows:
            compress(data, render.PNG_LEVEL)

    figures["floor_deflate_ms"] = _least_ms(repeats, lambda: floor(render.deflate.compress), len(rows))
    figures["floor_zlib_ms"] = _least_ms(repeats, lambda: floor(zlib.compress), len(rows))
    figures["thread_hop_ms"] = _hop_ms()
    figures["ratio_vs_floor"] = round(figures["render_ms"] / figures["floor_deflate_ms"], 2)
    figures["speedup_vs_zlib_pillow"] = round(figures["render_zlib_pillow_ms"] / figures["render_ms"], 2)
    figures = {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}
    return figures
