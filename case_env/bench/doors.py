"""How the load generator reaches a server, by protocol: each rollout holds one `Door` for its whole run.

`case-env` posts to the tool API and `openenv` to a stateless `/step` (the OpenEnv baseline), over the lean
keep-alive client; `openenv-door` keeps one OpenEnv WebSocket session per rollout (a reset per episode, a
step per call), and `mcp-door` one MCP client (the official SDK; `start_episode` per episode), as their
users' clients would.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from case_env.bench.client import Client

PROTOCOLS = ("case-env", "openenv", "openenv-door", "mcp-door")


class Door:
    """One rollout's way in: `begin` an episode on a case, then `call` its tools; (kind, answer) per call,
    kind being `ok`, `tool_<code>` or `http_<status>`."""

    def __init__(self, url: str, env: str, protocol: str):
        self.url, self.env, self.protocol = url, env, protocol
        self.client = Client(url, timeout_s=60.0)
        self.episode = self.patient = ""
        self._stack = contextlib.AsyncExitStack()
        self._session: Any = None

    async def begin(self, patient: str, episode: str) -> None:
        self.patient, self.episode = patient, episode
        if self.protocol == "openenv-door":
            if self._session is None:
                from websockets.asyncio.client import connect

                ws_url = self.url.replace("http://", "ws://", 1) + f"/openenv/{self.env}/ws"
                self._session = await self._stack.enter_async_context(connect(ws_url, max_size=None))
            await self._session.send(json.dumps({"type": "reset", "data": {"case_id": patient}}))
            answer = json.loads(await self._session.recv())
            if answer.get("type") == "error":
                raise RuntimeError(f"OpenEnv reset refused: {answer['data'].get('message')}")
        elif self.protocol == "mcp-door":
            if self._session is None:
                import httpx2
                from mcp import Client as MCPClient
                from mcp.client.streamable_http import streamable_http_client

                http = await self._stack.enter_async_context(httpx2.AsyncClient(timeout=60.0))
                transport = streamable_http_client(f"{self.url}/mcp/{self.env}/", http_client=http)
                self._session = await self._stack.enter_async_context(MCPClient(transport))
            started = await self._session.call_tool("start_episode", {"case_id": patient})
            if started.is_error:
                raise RuntimeError(f"MCP start_episode refused: {started.content[0].text}")
            self.episode = started.structured_content["episode_id"]

    async def call(self, tool: str, arguments: dict, context: dict | None) -> tuple[str, bytes]:
        if self.protocol == "openenv-door":
            await self._session.send(
                json.dumps({"type": "step", "data": {"tool": tool, "arguments": arguments}})
            )
            raw = await self._session.recv()
            observation = (json.loads(raw).get("data") or {}).get("observation") or {}
            return ("ok" if observation.get("ok") else f"tool_{observation.get('error')}"), raw.encode()
        if self.protocol == "mcp-door":
            result = await self._session.call_tool(tool, {**arguments, "episode_id": self.episode})
            return ("tool_error" if result.is_error else "ok"), b""
        body: dict[str, Any] = {
            "episode_id": self.episode,
            "patient_id": self.patient,
            "arguments": arguments,
        }
        if context is not None:  # what the caller sends beside the arguments (an episode's earlier exchanges)
            body["context"] = context
        if self.protocol == "openenv":
            target, body = "/step", {"action": {"tool": tool, **body}}
        else:
            target = f"/v1/tools/{tool}"
        status, payload = await self.client.post_json(target, body)
        if status != 200:
            return f"http_{status}", payload
        return ("ok" if b'"ok":true' in payload else f"tool_{_error_code(payload)}"), payload

    async def close(self) -> None:
        self.client.close()
        with contextlib.suppress(Exception):
            await self._stack.aclose()


def _error_code(payload: bytes) -> str:
    document = json.loads(payload)
    error = document.get("error") or (document.get("observation") or {}).get("error") or {}
    return str(error.get("code", "unknown"))
