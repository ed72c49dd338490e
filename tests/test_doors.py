"""The OpenEnv and MCP doors against a live server, driven by each peer's own client library: OpenEnv's
`GenericEnvClient` over its WebSocket session, the official MCP SDK's `Client` over streamable HTTP. Each
call's answer equals the tool API's for the same case, the reward is the row's, and the API's scope and token
refusals hold at each door."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from pathlib import Path

import httpx
import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from openenv.core.generic_client import GenericEnvClient

from case_env.core.bank import load_items
from case_env.envs.imaging.bench.mixes import episode_calls
from tests.server_harness import live_server

TOKEN = "doors-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(dataset, bank, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("doors-server")
    with live_server(dataset, tmp, protocols="verl,openenv,mcp", banks=[bank], token=TOKEN) as live:
        yield live


@pytest.fixture(scope="module")
def rows(bank) -> dict:
    return {item.key: item for item in load_items(bank) if item.key.startswith("test-")}


def api_text(server, case_id: str, tool: str, arguments: dict) -> dict:
    body = {"episode_id": f"api-{random.getrandbits(48)}", "patient_id": case_id, "arguments": arguments}
    return httpx.post(f"{server.url}/v1/tools/{tool}", json=body, headers=AUTH, timeout=30).json()


def openenv(server) -> GenericEnvClient:
    return GenericEnvClient(base_url=f"{server.url}/openenv/imaging", headers=AUTH)


def test_an_openenv_episode_answers_as_the_api_and_is_scored_by_the_row(server, rows):
    key, item = next(iter(rows.items()))

    async def episode():
        async with openenv(server) as env:
            reset = await env.reset(row=key)
            observed = reset.observation
            assert observed["case_id"] == item.extra["patient_id"] and observed["prompt"] == item.prompt
            assert [t["function"]["name"] for t in observed["tools"]] == item.extra["tool_selection"]
            steps = []
            for tool, arguments in episode_calls(random.Random(3)):
                steps.append(
                    (tool, arguments, (await env.step({"tool": tool, "arguments": arguments})).observation)
                )
            wrong = (
                await env.step(
                    {"tool": "get_organ_volume", "arguments": {"organ": "brain", "visit": "baseline"}}
                )
            ).observation
            state = await env.state()
            final = await env.step({"answer": f"<answer>{item.ground_truth}</answer>"})
            return steps, wrong, state, final

    steps, wrong, state, final = asyncio.run(episode())
    for tool, arguments, observed in steps:
        expected = api_text(server, item.extra["patient_id"], tool, arguments)
        assert observed["ok"] == expected["ok"] and observed["text"] == expected["text"], tool
        assert [i["data_b64"] for i in observed["images"]] == [i["data_b64"] for i in expected["images"]]
    assert not wrong["ok"] and wrong["error"] == "unknown_organ" and "liver" in wrong["text"]
    assert state["calls"] == len(steps) + 1 and state["row"] == key and not state["ended"]
    assert final.done and final.reward == 1.0 and final.observation["metadata"]["acc"] == 1.0
    calls = httpx.get(f"{server.url}/v1/episodes/{state['episode_id']}", headers=AUTH, timeout=10).json()
    assert len(calls["calls"]) == len(steps) + 1  # the API's own episode log holds the door's calls


def test_openenv_sessions_run_side_by_side_and_a_wrong_answer_scores_zero(server, rows):
    keys = list(rows)[:8]

    async def one(key: str) -> float:
        async with openenv(server) as env:
            await env.reset(row=key)
            await env.step({"tool": "list_visits", "arguments": {}})
            return (await env.step({"answer": "<answer>not a choice</answer>"})).reward

    async def side_by_side() -> list[float]:
        return await asyncio.wait_for(asyncio.gather(*map(one, keys)), 120)

    assert asyncio.run(side_by_side()) == [0.0] * len(keys)


def test_openenv_refuses_what_the_api_refuses(server, rows):
    second = next(iter(rows))
    first = next(k for k in rows if rows[k].extra["patient_id"] != rows[second].extra["patient_id"])

    async def scope() -> str:
        async with openenv(server) as a, openenv(server) as b:
            bound = (await a.reset(row=first)).observation["episode_id"]
            try:
                await b.reset(row=second, episode_id=bound)  # another case under the same episode id
            except Exception as exc:  # OpenEnv's client raises the server's error message
                return str(exc)
            return "accepted"

    assert "bound to another case" in asyncio.run(scope())

    async def unknown_split() -> str:
        async with openenv(server) as env:
            try:
                await env.reset(split="trian")
            except Exception as exc:
                return str(exc)
            return "accepted"

    assert "trian" in (message := asyncio.run(unknown_split())) and "test" in message

    async def no_token() -> None:
        async with GenericEnvClient(base_url=f"{server.url}/openenv/imaging") as env:
            await env.reset()

    with pytest.raises(ConnectionError):
        asyncio.run(no_token())


def leaves(error: BaseException) -> list[str]:
    if isinstance(error, BaseExceptionGroup):
        return [text for inner in error.exceptions for text in leaves(inner)]
    return [f"{type(error).__name__}: {error} {getattr(error, 'code', '')} {getattr(error, 'data', '')}"]


def mcp_client(server, headers: dict | None = AUTH) -> Client:
    http = httpx2.AsyncClient(headers=headers or {}, timeout=30)
    return Client(streamable_http_client(f"{server.url}/mcp/imaging/", http_client=http))


def test_mcp_lists_the_api_tools_and_calls_each_within_the_episode_case(server, rows):
    item = next(iter(rows.values()))
    case_id = item.extra["patient_id"]
    served = httpx.get(f"{server.url}/v1/tools?env=imaging", headers=AUTH, timeout=10).json()["tools"]

    async def session():
        async with mcp_client(server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            before = await client.call_tool("list_visits", {"episode_id": "never-started"})
            started = await client.call_tool("start_episode", {"row": item.key})
            episode = started.structured_content["episode_id"]
            answers = []
            for tool, arguments in episode_calls(random.Random(5)):
                answers.append(
                    (tool, arguments, await client.call_tool(tool, {**arguments, "episode_id": episode}))
                )
            answer = f"<answer>{item.ground_truth}</answer>"
            finished = await client.call_tool("finish_episode", {"episode_id": episode, "answer": answer})
            return listed, before, started, answers, finished

    listed, before, started, answers, finished = asyncio.run(session())
    for tool in served:
        parameters = tool["schema"]["function"]["parameters"]
        schema = listed[tool["name"]].input_schema
        assert schema["required"] == ["episode_id", *parameters.get("required", [])], tool["name"]
        assert {k: v for k, v in schema["properties"].items() if k != "episode_id"} == parameters[
            "properties"
        ]
    assert {"start_episode", "finish_episode"} <= set(listed)
    assert before.is_error and "start_episode" in before.content[0].text
    assert started.structured_content["case_id"] == case_id
    assert started.structured_content["prompt"] == item.prompt
    assert {t for t, _, _ in answers} == {t["name"] for t in served}  # every tool called
    for tool, arguments, result in answers:
        expected = api_text(server, case_id, tool, arguments)
        assert result.content[0].text == expected["text"] and result.is_error == (not expected["ok"]), tool
        images = [c for c in result.content if c.type == "image"]
        assert [i.data for i in images] == [i["data_b64"] for i in expected["images"]]
        assert all(i.mime_type == "image/png" for i in images)
    assert finished.structured_content["score"] == 1.0


def test_mcp_refuses_another_case_under_a_bound_episode_and_a_missing_token(server, rows):
    items = list(rows.values())
    other = next(i for i in items if i.extra["patient_id"] != items[0].extra["patient_id"])

    async def switch():
        async with mcp_client(server) as client:
            started = await client.call_tool("start_episode", {"row": items[0].key})
            episode = started.structured_content["episode_id"]
            return await client.call_tool("start_episode", {"row": other.key, "episode_id": episode})

    refused = asyncio.run(switch())
    assert refused.is_error and "bound to another case" in refused.content[0].text

    async def no_token() -> str:
        try:
            async with mcp_client(server, headers=None) as client:
                await client.list_tools()
        except BaseExceptionGroup as group:  # the SDK's task groups hold the transport's HTTP error
            return " ".join(leaves(group))
        return "listed"

    refused = asyncio.run(no_token())
    assert refused.startswith("MCPError"), refused  # the SDK's client refused, nothing listed
    reply = httpx.post(
        f"{server.url}/mcp/imaging/",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
        timeout=10,
    )
    assert reply.status_code == 401 and json.loads(reply.text)["error"]["code"] == "unauthorized"


@pytest.fixture(scope="module")
def official_calls(server, rows) -> tuple[httpx.Request, list[httpx.Request]]:
    """The requests the official MCP client sends for an episode on the first row, as sent (headers and
    all): its `start_episode`, then each tool, a refused organ, an episode never started."""
    item = next(iter(rows.values()))
    sent: list[httpx.Request] = []

    async def keep(request) -> None:
        content = await request.aread()
        sent.append(
            httpx.Request(request.method, str(request.url), headers=dict(request.headers), content=content)
        )

    async def session() -> None:
        http = httpx2.AsyncClient(headers=AUTH, timeout=30, event_hooks={"request": [keep]})
        async with Client(streamable_http_client(f"{server.url}/mcp/imaging/", http_client=http)) as client:
            await client.call_tool("start_episode", {"row": item.key, "episode_id": "front-0"})
            for tool, arguments in episode_calls(random.Random(11)):
                await client.call_tool(tool, {**arguments, "episode_id": "front-0"})
            await client.call_tool("get_organ_volume", {"episode_id": "front-0", "organ": "brain"})
            await client.call_tool("list_visits", {"episode_id": "never-started"})

    asyncio.run(session())
    calls = [r for r in sent if b'"tools/call"' in r.content]
    return calls[0], calls[1:]


def fresh_episode(official_calls, episode_id: str) -> None:
    """Start (or start again, with no calls) the episode `episode_id` on the first row."""
    start = official_calls[0]
    body = json.loads(start.content)
    body["params"]["arguments"]["episode_id"] = episode_id
    reply = httpx.post(str(start.url), headers=without_length(start.headers), json=body, timeout=30)
    assert reply.status_code == 200 and b'"isError":false' in reply.content


def without_length(headers) -> dict:
    return {k: v for k, v in headers.items() if k.lower() != "content-length"}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_mcp_request_near_a_call_gets_a_protocol_answer_never_a_failure(server, official_calls, data):
    """Requests near a well-formed `tools/call`, each part of the envelope and headers changed as a client
    gets it wrong: the endpoint answers each with MCP's own answer (a result or a JSON-RPC error, or an HTTP
    refusal of the transport), never a 500, a Python message or a traceback."""
    template = official_calls[1][0]
    body = json.loads(template.content)
    headers = without_length(template.headers)
    episode = f"hyp-{data.draw(st.integers(0, 10**9))}"
    body["params"]["arguments"] = {"episode_id": episode}
    params = body["params"]
    junk = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 3),
        st.floats(allow_nan=False),
        st.text(max_size=5),
        st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    )
    pick = data.draw
    changes = {
        "id": lambda: body.update(id=pick(st.one_of(junk, st.just("abc"), st.integers(10**12, 10**13)))),
        "jsonrpc": lambda: body.update(jsonrpc=pick(st.one_of(junk, st.just("1.0")))),
        "method": lambda: body.update(method=pick(st.sampled_from(["tools/list", "tools/cal", "ping"]))),
        "params": lambda: body.update(params=pick(junk)),
        "extra": lambda: body.update(extra=1),
        "name": lambda: params.update(name=pick(st.one_of(junk, st.sampled_from(["nope", "read_report"])))),
        "arguments": lambda: params.update(arguments=pick(junk)),
        "argument": lambda: params["arguments"].update(
            {pick(st.sampled_from(["visit", "organ", "x"])): pick(st.one_of(junk, st.just("baseline")))}
        ),
        "meta": lambda: params.update(_meta=pick(st.one_of(junk, st.just({})))),
        "version": lambda: params["_meta"].update(
            {"io.modelcontextprotocol/protocolVersion": pick(st.sampled_from(["2025-11-25", "2099-01-01"]))}
        ),
        "version_header": lambda: headers.update(
            {"mcp-protocol-version": pick(st.sampled_from(["2099-01-01", "2025-11-25", ""]))}
        ),
        "method_header": lambda: headers.update({"mcp-method": pick(st.sampled_from(["tools/list", "x"]))}),
        "name_header": lambda: headers.update({"mcp-name": pick(st.sampled_from(["read_report", ""]))}),
        "accept": lambda: headers.update(
            {
                "accept": pick(
                    st.sampled_from(["text/event-stream", "*/*", "application/*;q=0.5", "text/html"])
                )
            }
        ),
        "param_header": lambda: headers.update({"mcp-param-visit": "baseline"}),
        "drop_header": lambda: headers.pop(pick(st.sampled_from(["mcp-method", "mcp-name", "accept"]))),
        "content_type": lambda: headers.update(
            {"content-type": pick(st.sampled_from(["application/json; charset=utf-8", "text/plain"]))}
        ),
        "twice": lambda: repeated.append(
            pick(
                st.sampled_from(
                    [("accept", "text/html"), ("content-type", "text/plain"), ("mcp-method", "x")]
                )
            )
        ),
    }
    repeated: list[tuple[str, str]] = []  # headers sent a second time, after the first
    chosen = pick(st.lists(st.sampled_from(sorted(changes)), max_size=3, unique=True))
    for change in chosen:
        with contextlib.suppress(AttributeError, KeyError, TypeError):  # what an earlier change replaced
            changes[change]()
    lines = [*headers.items(), *repeated]
    fresh_episode(official_calls, episode)
    with httpx.Client(timeout=30) as client:
        reply = client.post(str(template.url), headers=lines, content=json.dumps(body).encode())
    assert reply.status_code in (200, 202, 400, 404, 405, 406, 415, 422), (
        reply.status_code,
        chosen,
        reply.text,
    )
    assert "Traceback" not in reply.text and "object has no attribute" not in reply.text, reply.text
    if reply.status_code == 200:
        answer = reply.json()
        assert answer.get("jsonrpc") == "2.0" and ("result" in answer or "error" in answer), answer


def test_the_doors_are_in_the_openapi_document_which_stays_valid(server):
    from openapi_spec_validator import validate

    document = httpx.get(f"{server.url}/openapi.json", headers=AUTH, timeout=10).json()
    validate(document)
    paths = set(document["paths"])
    for env in ("imaging", "clinic", "casereason"):
        assert {f"/openenv/{env}/schema", f"/openenv/{env}/health", f"/mcp/{env}/"} <= paths
    assert "/v1/rows/{env}" in paths
    assert "/openenv/imaging/reset" not in paths  # episodes live on the WebSocket, not on stateless HTTP
    schema = httpx.get(f"{server.url}/openenv/imaging/schema", headers=AUTH, timeout=10).json()
    assert "answer" in schema["action"]["properties"] and "images" in schema["observation"]["properties"]
    assert httpx.get(f"{server.url}/openenv/imaging/schema", timeout=10).status_code == 401


def test_the_rows_a_door_lists_carry_prompts_and_tools_but_never_answers(server, rows):
    url = f"{server.url}/v1/rows/imaging"
    listed = httpx.get(url, params={"limit": 3, "offset": 1}, headers=AUTH, timeout=10).json()
    assert listed["split"] == "test" and listed["total"] == len(rows)
    assert [r["row"] for r in listed["rows"]] == sorted(rows)[1:4]
    for row in listed["rows"]:
        item = rows[row["row"]]
        assert row["prompt"][-1]["content"] == item.prompt[-1]["content"]
        assert row["tools"] == item.extra["tool_selection"]
    assert "ground_truth" not in json.dumps(listed) and "reward_model" not in json.dumps(listed)

    assert httpx.get(url, timeout=10).status_code == 401
    unknown = httpx.get(url, params={"split": "trian"}, headers=AUTH, timeout=10)
    assert unknown.status_code == 404 and "have train, val, test" in unknown.json()["error"]["message"]
    missing = httpx.get(f"{server.url}/v1/rows/nothing", headers=AUTH, timeout=10)
    assert missing.status_code == 404 and "--bank BANK" in missing.json()["error"]["message"]


def test_every_cell_of_the_readme_door_table_names_a_test_that_exists():
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Doors: one server, every protocol", 1)[1].split("\n## ", 1)[0]
    named = [
        cell.strip("` ") for line in table.splitlines() if line.startswith("| ") for cell in line.split("|")
    ]
    tests = [cell for cell in named if cell.startswith("tests/") and "::" in cell]
    assert len(tests) == 6
    for test in tests:
        path, name = test.split("::")
        assert f"def {name}(" in (Path(__file__).parent.parent / path).read_text(encoding="utf-8"), test


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--protocols", "verl,grpc"], "unknown protocol 'grpc'; choose from verl, openenv, mcp"),
        (["--protocols", "mcp", "--workers", "2"], "serve it with --workers 1"),
        (["--protocols", "openenv", "--bank", "no-such-bank"], "bank no-such-bank does not exist"),
    ],
)
def test_serve_refuses_doors_it_cannot_serve_in_one_line(dataset, arguments, named):
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "case_env.cli",
            "serve",
            "--data-root",
            str(dataset),
            "--port",
            "0",
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr
