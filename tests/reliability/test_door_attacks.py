"""Check 18: what an outside attack on the OpenEnv and MCP doors found, each request replayed as it was sent:
the doors hold as the tool API holds. Oversized and malformed frames get OpenEnv's own error and the session goes on;
wrongly typed starts are refused by name; an ended episode is never reopened; past the cap the least
recently used episode goes, ended ones first; sessions no connection holds expire in seconds; the
document lists what each route answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from case_env.bench.process import ServerProcess
from tests.test_doors import AUTH, TOKEN, rows, server  # noqa: F401 (fixtures)

MCP_VERSION = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MCP_VERSION,
    "io.modelcontextprotocol/clientInfo": {"name": "attacker", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def mcp(url: str, tool: str, arguments, env: str = "imaging") -> dict:
    """One MCP `tools/call` as the official client sends it; its JSON-RPC answer."""
    headers = {
        **AUTH,
        "Accept": "application/json, text/event-stream",
        "Mcp-Protocol-Version": MCP_VERSION,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    body["params"]["_meta"] = META
    # JSON text as a client writes it: a lone surrogate (\ud800) escaped, as the attacker sent it
    headers["Content-Type"] = "application/json"
    reply = httpx.post(f"{url}/mcp/{env}/", content=json.dumps(body), headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def result(answer: dict) -> tuple[bool, str, dict]:
    assert "error" not in answer, answer  # never a JSON-RPC internal error (-32603)
    found = answer["result"]
    return found["isError"], found["content"][0]["text"], found.get("structuredContent") or {}


async def session(live, env: str = "imaging"):
    url = live.url.replace("http://", "ws://") + f"/openenv/{env}/ws"
    return await connect(url, additional_headers=AUTH, max_size=None)


async def exchange(ws, frame) -> dict:
    await ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))
    return json.loads(await ws.recv())


def test_malformed_frames_get_an_error_and_the_session_goes_on(server, rows, figures):  # noqa: F811
    row = next(iter(rows))

    async def attack() -> list[dict]:
        answers = []
        async with await session(server) as ws:
            reset = await exchange(ws, {"type": "reset", "data": {"row": row}})
            assert reset["type"] == "observation", reset
            for frame in (
                {"type": "step", "data": {}},
                {"type": "step", "data": {"tool": "list_visits", "answer": "<answer>A</answer>"}},
                "[1,2]",
                "5",
                '"x"',
                "null",
                b"\x00\x01binary",
                "[" * 100_000 + "]" * 100_000,
            ):
                answers.append(await exchange(ws, frame))
            # the same session still serves its episode
            answers.append(await exchange(ws, {"type": "step", "data": {"tool": "list_visits"}}))
        return answers

    answers = asyncio.run(attack())
    *refused, after = answers
    figures.update(
        frames=len(refused), error_frames=sum(a["type"] == "error" for a in refused), sessions_closed=0
    )
    assert all(a["type"] == "error" for a in refused), refused
    messages = [json.dumps(a["data"]) for a in refused]  # OpenEnv's message with its validation errors
    assert "either tool (with arguments) or answer" in messages[0] and "either tool" in messages[1]
    assert all("serialize" not in m and "Traceback" not in m for m in messages), messages
    assert "binary frames" in messages[6] and "nested too deeply" in messages[7]
    assert after["type"] == "observation" and after["data"]["observation"]["ok"], after


def test_an_oversized_argument_is_refused_by_the_calls_own_limit(server, rows, figures):  # noqa: F811
    row = next(iter(rows))
    big = {"organ": "liver", "visit": "baseline", "x": "A" * 1_900_000}  # within a frame, past a call

    async def attack() -> tuple[dict, dict, str, list[float]]:
        async with await session(server) as ws:
            reset = await exchange(ws, {"type": "reset", "data": {"row": row}})
            episode = reset["data"]["observation"]["episode_id"]
            refused = await exchange(
                ws, {"type": "step", "data": {"tool": "get_organ_volume", "arguments": big}}
            )
            # a frame of 10 MB, past the door's bound: refused before it is parsed, /healthz unhurt meanwhile
            waits: list[float] = []

            async def poll() -> None:
                async with httpx.AsyncClient(timeout=10) as client:
                    for _ in range(10):
                        began = time.perf_counter()
                        await client.get(f"{server.url}/healthz")
                        waits.append(time.perf_counter() - began)

            poller = asyncio.create_task(poll())
            huge = {
                "type": "step",
                "data": {"tool": "get_organ_volume", "arguments": {"x": "A" * 10_000_000}},
            }
            too_large = await exchange(ws, huge)
            await poller
            return refused, too_large, episode, waits

    refused, too_large, episode, waits = asyncio.run(attack())
    logged = httpx.get(f"{server.url}/v1/episodes/{episode}", headers=AUTH, timeout=30)
    figures.update(
        healthz_worst_ms_under_10mb_frame=round(1000 * max(waits), 1), episode_log_bytes=len(logged.content)
    )
    assert refused["type"] == "error" and "more than 65536 characters" in refused["data"]["message"]
    assert too_large["type"] == "error" and "message too large" in too_large["data"]["message"]
    assert len(logged.content) < 10_000  # nothing of the refused calls reached the log
    assert max(waits) < 0.25, waits


@pytest.mark.parametrize(
    ("start", "named"),
    [
        ({"split": {"a": 1}}, "split"),
        ({"row": ["test-00000"]}, "row"),
        ({"case_id": {"x": 1}}, "case_id"),
        ({"episode_id": 7}, "episode_id"),
        ({"episode_id": "\ud800"}, "episode_id"),
        ({"index": True}, "index"),
        ({"rows": "test-00000"}, "rows"),
    ],
)
def test_wrongly_typed_starts_are_refused_by_name_at_both_doors(server, start, named):  # noqa: F811
    error, text, _ = result(mcp(server.url, "start_episode", start))
    assert error and f"invalid start: {named}" in text, text
    assert "unhashable" not in text and "attribute" not in text

    async def reset() -> dict:
        async with await session(server) as ws:
            return await exchange(ws, {"type": "reset", "data": start})

    answer = asyncio.run(reset())
    assert answer["type"] == "error" and f"invalid start: {named}" in answer["data"]["message"], answer


def test_an_ended_episode_is_never_reopened_on_any_door(server, rows):  # noqa: F811
    row = next(iter(rows))
    error, _, started = result(mcp(server.url, "start_episode", {"row": row, "episode_id": "oracle"}))
    assert not error
    first = result(
        mcp(server.url, "finish_episode", {"episode_id": "oracle", "answer": "<answer>A</answer>"})
    )
    score = first[2]["score"]
    for letter in "BCD":  # the oracle the audit found: start again, answer again
        error, text, _ = result(mcp(server.url, "start_episode", {"row": row, "episode_id": "oracle"}))
        assert error and "has ended" in text
        error, text, _ = result(
            mcp(
                server.url, "finish_episode", {"episode_id": "oracle", "answer": f"<answer>{letter}</answer>"}
            )
        )
        assert error and "has ended" in text
    kept = httpx.get(f"{server.url}/v1/episodes/oracle", headers=AUTH, timeout=30).json()
    assert kept["ended"] and kept["reward"]["score"] == score
    body = {"episode_id": "oracle", "patient_id": started["case_id"], "arguments": {}}
    api = httpx.post(f"{server.url}/v1/tools/list_visits", json=body, headers=AUTH, timeout=30)
    assert api.status_code == 409 and api.json()["error"]["code"] == "episode_ended"

    async def openenv_reopen() -> dict:
        async with await session(server) as ws:
            return await exchange(ws, {"type": "reset", "data": {"row": row, "episode_id": "oracle"}})

    assert "has ended" in asyncio.run(openenv_reopen())["data"]["message"]


def test_the_document_says_what_the_doors_answer(server):  # noqa: F811
    document = httpx.get(f"{server.url}/openapi.json", headers=AUTH, timeout=30).json()
    health = document["paths"]["/healthz"]["get"]["responses"]["200"]["content"]["application/json"]
    assert health["schema"] == {"$ref": "#/components/schemas/HealthResponse"}
    assert set(document["components"]["schemas"]["HealthResponse"]["properties"]) == {"status", "version"}
    assert {"400", "401", "406"} <= set(document["paths"]["/mcp/imaging/"]["post"]["responses"])
    # OpenEnv's task API, which answers 501 for an environment without one, is not served or documented
    assert not [p for p in document["paths"] if p.startswith("/openenv/") and "{env_name}" in p]
    splits = httpx.get(f"{server.url}/openenv/imaging/imaging/splits", headers=AUTH, timeout=30)
    assert splits.status_code == 404
    for path in ("/mcp/imaging/x", "/mcp/imaging//", "/mcp/imaging"):
        assert httpx.post(f"{server.url}{path}", json={}, headers=AUTH, timeout=30).status_code == 404, path
    # a schema-valid attempt budget, written as JSON Schema allows an integer (2.0), is scored, not refused
    extra = {"env": "casereason", "casereason": {"attempts": 2.0}}
    score = {"data_source": "casereason", "solution_str": "<answer>flu</answer>", "ground_truth": "flu"}
    scored = httpx.post(
        f"{server.url}/v1/score", json={**score, "extra_info": extra}, headers=AUTH, timeout=30
    )
    assert scored.status_code == 200 and scored.json()["env"] == "casereason", scored.text


def door_server(dataset, bank, tmp_path, **settings) -> ServerProcess:
    env = {
        "CASE_ENV_DATA_ROOT": str(dataset),
        "CASE_ENV_CACHE_DIR": str(tmp_path / "cache"),
        "CASE_ENV_PROTOCOLS": "verl,openenv,mcp",
        "CASE_ENV_BANKS": json.dumps([str(bank)]),
        "CASE_ENV_TOKEN": TOKEN,
        **{f"CASE_ENV_{k.upper()}": str(v) for k, v in settings.items()},
    }
    return ServerProcess(tmp_path / "server.log", env)


def test_past_the_cap_the_least_recently_used_episode_goes_ended_ones_first(dataset, bank, tmp_path):
    with door_server(dataset, bank, tmp_path, max_episodes=4) as live:
        start = {
            n: result(mcp(live.url, "start_episode", {"split": "test", "index": 0, "episode_id": n}))
            for n in "AB"
        }
        assert not any(error for error, _, _ in start.values())
        result(mcp(live.url, "finish_episode", {"episode_id": "B", "answer": "<answer>A</answer>"}))
        for n in "CD":
            result(mcp(live.url, "start_episode", {"split": "test", "index": 0, "episode_id": n}))
        assert not result(mcp(live.url, "list_visits", {"episode_id": "A"}))[0]  # A used after C and D began
        result(mcp(live.url, "start_episode", {"split": "test", "index": 0, "episode_id": "E"}))  # B goes
        result(mcp(live.url, "start_episode", {"split": "test", "index": 0, "episode_id": "F"}))  # then C
        live_calls = {n: result(mcp(live.url, "list_visits", {"episode_id": n})) for n in "ACDEF"}
        finished = result(
            mcp(live.url, "finish_episode", {"episode_id": "A", "answer": "<answer>A</answer>"})
        )
        ready = httpx.get(f"{live.url}/readyz", headers=AUTH, timeout=30).json()
    assert not live_calls["A"][0] and not finished[0]  # the early live episode kept its reward
    assert live_calls["C"][0] and "unknown episode_id" in live_calls["C"][1]
    assert not any(live_calls[n][0] for n in "DEF")
    assert ready["max_episodes"] == 4 and ready["episode_idle_s"] == 3600.0


def test_sessions_no_connection_holds_expire_in_seconds(dataset, bank, tmp_path):
    """`openenv/session/create` over OpenEnv's HTTP endpoint, repeated to its cap, shut WebSocket clients out
    for an hour; now such sessions close after CASE_ENV_DOOR_SESSION_IDLE_S."""
    with door_server(dataset, bank, tmp_path, max_in_flight=2, door_session_idle_s=1) as live:
        create = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
        made = [
            httpx.post(f"{live.url}/openenv/imaging/mcp", json=create, headers=AUTH, timeout=30).json()
            for _ in range(9)
        ]
        assert "at capacity" in json.dumps(made[-1]), made[-1]  # the cap: 4 x max_in_flight

        async def reset() -> dict:
            async with await connect(
                live.url.replace("http://", "ws://") + "/openenv/imaging/ws", additional_headers=AUTH
            ) as ws:
                # at capacity OpenEnv answers on connect and closes: a frame sent then may meet the close,
                # and the answer is still read
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(json.dumps({"type": "reset", "data": {"split": "test", "index": 0}}))
                return json.loads(await ws.recv())

        assert "capacity" in json.dumps(asyncio.run(reset()))
        time.sleep(7)  # the idle time, and OpenEnv's reaper's round (at least 5 s)
        assert asyncio.run(reset())["type"] == "observation"
