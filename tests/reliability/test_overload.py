"""Check 5: overload. 2,000 tool calls arrive at once at a server whose in-flight bound is far lower.

Raw HTTP first: every call must get 200 or 429 (with Retry-After), none a 5xx, none left hanging past the
per-call deadline. Then the same burst through verl's adapter (`CaseTool`, default retry settings, its
concurrency cap lifted so the burst really lands at once): backoff must carry every call to its answer.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import aiohttp
from verl.tools.schemas import OpenAIFunctionToolSchema

from case_env.bench.load import percentile
from case_env.bench.process import ServerProcess
from case_env.core import registry
from case_env.envs.imaging.data.index import scan
from case_env.verl import CaseTool
from tests.reliability.conftest import size

CALLS = size(ci=400, full=2000)
MAX_IN_FLIGHT = 32
MAX_QUEUED = 64  # the server's queue absorbs a burst this big; the rest must be refused and retried
DEADLINE_S = 10.0


def _arguments(n: int) -> dict:
    """Distinct calls (no two share an answer), so the response cache cannot absorb the burst."""
    return {
        "visit": ("baseline", "follow_up")[n % 2],
        "sequence": ("water", "fat", "in", "opp")[n // 2 % 4],
        "plane": ("axial", "coronal", "sagittal")[n // 8 % 3],
        "position": n // 24 % 101,
    }


async def _raw_burst(url: str, patients: list[str]) -> dict:
    statuses: Counter = Counter()
    latencies: list[float] = []
    retry_after_missing = hung = 0
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # one connection per call, all at once
    timeout = aiohttp.ClientTimeout(total=DEADLINE_S + 10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = asyncio.Event()

        async def one(n: int) -> None:
            nonlocal retry_after_missing, hung
            body = {
                "episode_id": f"burst-{n}",
                "patient_id": patients[n % len(patients)],
                "arguments": _arguments(n),
            }
            await start.wait()
            began = time.perf_counter()
            try:
                async with session.post(f"{url}/v1/tools/render_slice", json=body) as response:
                    await response.read()
                    statuses[response.status] += 1
                    retry_after_missing += response.status == 429 and "Retry-After" not in response.headers
            except TimeoutError:
                hung += 1
            except aiohttp.ClientError as exc:
                statuses[type(exc).__name__] += 1
            latencies.append(time.perf_counter() - began)

        tasks = [asyncio.create_task(one(n)) for n in range(CALLS)]
        await asyncio.sleep(0.2)
        start.set()
        await asyncio.gather(*tasks)
    return {
        "statuses": statuses,
        "p50_ms": round(1000 * percentile(latencies, 50), 1),
        "p99_ms": round(1000 * percentile(latencies, 99), 1),
        "max_ms": round(1000 * max(latencies), 1),
        "hung": hung,
        "retry_after_missing": retry_after_missing,
    }


async def _adapter_burst(url: str, patients: list[str]) -> dict:
    schema = OpenAIFunctionToolSchema.model_validate(registry.all_tools()["render_slice"].openai_schema())
    tool = CaseTool({"type": "native", "base_url": url, "max_concurrency": CALLS}, schema)

    async def one(n: int) -> dict:
        instance, _ = await tool.create(create_kwargs={"patient_id": patients[n % len(patients)]})
        arguments = _arguments(n + CALLS // 2)  # half repeat the raw burst's calls, half are new
        response, _, metrics = await tool.execute(instance, arguments)
        await tool.release(instance)
        metrics["has_image"] = bool(response.image)
        return metrics

    began = time.perf_counter()
    results = await asyncio.gather(*[one(n) for n in range(CALLS)])
    return {"seconds": round(time.perf_counter() - began, 1), "results": results}


def test_overload(dataset, tmp_path, figures):
    patients = scan(dataset).patient_ids()
    env = {
        "CASE_ENV_DATA_ROOT": str(dataset),
        "CASE_ENV_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT),
        "CASE_ENV_MAX_QUEUED": str(MAX_QUEUED),
        "CASE_ENV_TOOL_DEADLINE_S": str(DEADLINE_S),
        "CASE_ENV_CACHE_DIR": str(tmp_path / "cache"),
        "CASE_ENV_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        "CASE_ENV_TOKEN": None,
    }
    with ServerProcess(tmp_path / "server.log", env) as server:
        raw = asyncio.run(_raw_burst(server.url, patients))
        adapter = asyncio.run(_adapter_burst(server.url, patients))
    results = adapter["results"]
    attempts = [r["attempts"] for r in results]
    statuses = raw["statuses"]
    audit_429 = (tmp_path / "audit.jsonl").read_text().count('"http_status": 429')
    figures.update(
        {
            "concurrent_calls": CALLS,
            "max_in_flight": MAX_IN_FLIGHT,
            "max_queued": MAX_QUEUED,
            "status_counts": {str(k): v for k, v in sorted(statuses.items(), key=str)},
            "status_5xx": sum(n for k, n in statuses.items() if isinstance(k, int) and k >= 500),
            "p50_ms": raw["p50_ms"],
            "p99_ms": raw["p99_ms"],
            "max_ms": raw["max_ms"],
            "hung_past_deadline": raw["hung"],
            "adapter_calls_completed": sum(r["status"] == "ok" and r["has_image"] for r in results),
            "adapter_seconds": adapter["seconds"],
            "adapter_attempts_max": max(attempts),
            "adapter_calls_retried": sum(a > 1 for a in attempts),
            "audit_lines_429": audit_429,
        }
    )
    assert set(statuses) <= {200, 429} and statuses[429] > 0, statuses  # the bound was really hit
    assert raw["hung"] == 0 and raw["retry_after_missing"] == 0
    assert raw["max_ms"] < (DEADLINE_S + 5) * 1000
    assert figures["adapter_calls_completed"] == CALLS, Counter(r["status"] for r in results)
    assert figures["adapter_calls_retried"] > 0
