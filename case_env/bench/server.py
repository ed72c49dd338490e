"""`case-env bench server`: per-tool latency and throughput of the real server under concurrent episodes.

The server runs as its own process (`case-env serve`, loopback); the load generator runs in this process
with asyncio and one HTTP connection per virtual rollout. Each rollout replays a realistic episode over a
random patient (visits, volumes, several renders, a comparison, a report), then starts another, until the
time is up. Figures are written to `bench.json`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx

from case_env.data.index import scan

EPISODE = [
    ("list_visits", {}),
    ("get_clinical_context", {"section": "demographics"}),
    ("get_organ_volume", {"organ": "liver", "visit": "baseline"}),
    ("compare_organ_volume", {"organ": "spleen"}),
    ("render_slice", {"visit": "baseline", "sequence": "water", "plane": "axial", "organ": "liver"}),
    ("render_slice", {"visit": "follow_up", "sequence": "fat", "plane": "coronal", "overlay": True}),
    ("render_comparison", {"sequence": "fat", "plane": "axial", "organ": "liver"}),
    ("render_slice", {"visit": "follow_up", "sequence": "opp", "plane": "sagittal", "position": 45}),
    ("read_report", {"visit": "follow_up"}),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return (
        ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]
        if ordered
        else float("nan")
    )


async def _rollout(client: httpx.AsyncClient, patients: list[str], stop: float, rng: random.Random,
                   samples: dict, errors: dict) -> None:  # fmt: skip
    while time.perf_counter() < stop:
        patient = rng.choice(patients)
        episode = f"bench-{rng.getrandbits(48):012x}"
        for tool, arguments in EPISODE:
            if time.perf_counter() >= stop:
                return
            body = {"episode_id": episode, "patient_id": patient, "arguments": dict(arguments)}
            if "position" not in arguments and tool.startswith("render"):
                body["arguments"]["position"] = rng.randint(20, 80)
            started = time.perf_counter()
            try:
                response = await client.post(f"/v1/tools/{tool}", json=body)
                kind = (
                    "ok"
                    if response.status_code == 200 and response.json()["ok"]
                    else f"http_{response.status_code}"
                )
            except httpx.HTTPError as exc:
                kind = type(exc).__name__
            elapsed = time.perf_counter() - started
            if kind == "ok":
                samples[tool].append(elapsed)
            else:
                errors[kind] += 1


async def _load(url: str, patients: list[str], clients: int, duration: float, warmup: float) -> dict:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        rng = random.Random(0)
        warm: dict = defaultdict(list)
        await asyncio.gather(*[_rollout(client, patients, time.perf_counter() + warmup, random.Random(i), warm,
                                        defaultdict(int)) for i in range(clients)])  # fmt: skip
        samples: dict = defaultdict(list)
        errors: dict = defaultdict(int)
        started = time.perf_counter()
        stop = started + duration
        await asyncio.gather(*[_rollout(client, patients, stop, random.Random(rng.random()), samples, errors)
                               for _ in range(clients)])  # fmt: skip
        elapsed = time.perf_counter() - started
    total = sum(len(v) for v in samples.values())
    return {
        "clients": clients,
        "duration_s": round(elapsed, 2),
        "calls": total,
        "calls_per_s": round(total / elapsed, 1),
        "errors": dict(errors),
        "latency_ms": {
            tool: {
                "n": len(v),
                "p50": round(1000 * percentile(v, 50), 1),
                "p95": round(1000 * percentile(v, 95), 1),
                "p99": round(1000 * percentile(v, 99), 1),
                "mean": round(1000 * statistics.fmean(v), 1),
            }
            for tool, v in sorted(samples.items())
        },
    }


def run_server_bench(
    data_root: Path, out: Path, clients: int, duration: float, workers: int, warmup: float
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "CASE_ENV_CACHE_DIR": str(out / "cache")}
    env.pop("CASE_ENV_TOKEN", None)
    command = [sys.executable, "-m", "case_env.cli", "serve", "--data-root", str(data_root), "--port", str(port),
               "--workers", str(workers), "--log-level", "warning"]  # fmt: skip
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"server exited: {server.stderr.read()[-2000:]}")
            try:
                ready = httpx.get(f"{url}/readyz", timeout=2)
                if ready.status_code == 200:
                    patients = ready.json()["patients"]
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.2)
        patient_ids = scan(data_root).patient_ids()
        result = asyncio.run(_load(url, patient_ids, clients, duration, warmup))
    finally:
        server.terminate()
        server.wait(timeout=30)
    result.update(
        {"benchmark": "server", "workers": workers, "patients": patients, "machine_cpus": os.cpu_count()}
    )
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result
