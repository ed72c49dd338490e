"""How the load generator reaches a server, by protocol: each rollout holds one `Door` for its whole run.

`case-env` posts to the tool API and `openenv` to a stateless `/step` (the OpenEnv baseline), with aiohttp
(keep-alive connections from one pool); `openenv-door` keeps one OpenEnv WebSocket session per rollout (a
reset per episode, a step per call), as its users' clients do. `mcp-door` posts MCP's own JSON-RPC requests
(protocol 2026-07-28, sessionless: `start_episode` per episode, then `tools/call`) with aiohttp: the official
SDK's client spends 3.5-13 ms of CPU per call, so 32 of them on the bench's cores starve the server they
measure (the contract tests use the SDK; here the wire format is the same, as the SDK sends it).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import aiohttp

PROTOCOLS = ("case-env", "openenv", "openenv-door", "mcp-door")
_MCP_VERSION = "2026-07-28"
_MCP_META = {
    "io.modelcontextprotocol/protocolVersion": _MCP_VERSION,
    "io.modelcontextprotocol/clientInfo": {"name": "case-env-bench", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
_MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Mcp-Protocol-Version": _MCP_VERSION,
    "Mcp-Method": "tools/call",
}
FAILURES = (OSError, TimeoutError, aiohttp.ClientError)  # what a call may fail with, besides an HTTP status


def session(rollouts: int, timeout_s: float = 60.0) -> aiohttp.ClientSession:
    """One pool for every rollout: a keep-alive connection each, none of them closed between calls."""
    connector = aiohttp.TCPConnector(limit=rollouts)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s))


class Door:
    """One rollout's way in: `begin` an episode on a case, then `call` its tools; (kind, answer) per call,
    kind being `ok`, `tool_<code>` or `http_<status>`."""

    def __init__(self, url: str, env: str, protocol: str, client: aiohttp.ClientSession):
        self.url, self.env, self.protocol = url, env, protocol
        self.client = client
        self.episode = self.case_id = ""
        self._stack = contextlib.AsyncExitStack()
        self._session: Any = None
        self._calls = 0

    async def begin(self, case_id: str, episode: str) -> None:
        self.case_id, self.episode = case_id, episode
        if self.protocol == "openenv-door":
            if self._session is None:
                from websockets.asyncio.client import connect

                ws_url = self.url.replace("http://", "ws://", 1) + f"/openenv/{self.env}/ws"
                self._session = await self._stack.enter_async_context(connect(ws_url, max_size=None))
            await self._session.send(json.dumps({"type": "reset", "data": {"case_id": case_id}}))
            answer = json.loads(await self._session.recv())
            if answer.get("type") == "error":
                raise RuntimeError(f"OpenEnv reset refused: {answer['data'].get('message')}")
        elif self.protocol == "mcp-door":
            status, payload = await self._mcp("start_episode", {"case_id": case_id})
            result = json.loads(payload).get("result") or {}
            if status != 200 or result.get("isError"):
                raise RuntimeError(f"MCP start_episode refused: {payload[:300]!r}")
            self.episode = result["structuredContent"]["episode_id"]

    async def call(self, tool: str, arguments: dict, context: dict | None) -> tuple[str, bytes]:
        if self.protocol == "openenv-door":
            await self._session.send(
                json.dumps({"type": "step", "data": {"tool": tool, "arguments": arguments}})
            )
            raw = await self._session.recv()
            observation = (json.loads(raw).get("data") or {}).get("observation") or {}
            return ("ok" if observation.get("ok") else f"tool_{observation.get('error')}"), raw.encode()
        if self.protocol == "mcp-door":
            status, payload = await self._mcp(tool, {**arguments, "episode_id": self.episode})
            if status != 200:
                return f"http_{status}", payload
            return ("tool_error" if b'"isError":true' in payload else "ok"), payload
        body: dict[str, Any] = {
            "episode_id": self.episode,
            "patient_id": self.case_id,
            "arguments": arguments,
        }
        if context is not None:  # what the caller sends beside the arguments (an episode's earlier exchanges)
            body["context"] = context
        if self.protocol == "openenv":
            target, body = "/step", {"action": {"tool": tool, **body}}
        else:
            target = f"/v1/tools/{tool}"
        status, payload = await self._post(target, body)
        if status != 200:
            return f"http_{status}", payload
        return ("ok" if b'"ok":true' in payload else f"tool_{_error_code(payload)}"), payload

    async def _mcp(self, tool: str, arguments: dict) -> tuple[int, bytes]:
        """One MCP `tools/call` as the official client sends it (its headers and `_meta`)."""
        self._calls += 1
        request = {
            "jsonrpc": "2.0",
            "id": self._calls,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": _MCP_META},
        }
        return await self._post(f"/mcp/{self.env}/", request, {**_MCP_HEADERS, "Mcp-Name": tool})

    async def _post(self, path: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
        async with self.client.post(self.url + path, json=body, headers=headers) as reply:
            return reply.status, await reply.read()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()


def _error_code(payload: bytes) -> str:
    document = json.loads(payload)
    error = document.get("error") or (document.get("observation") or {}).get("error") or {}
    return str(error.get("code", "unknown"))
