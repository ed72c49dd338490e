"""The client side of case-env's MCP door: one session per use, the server's bearer token from the
environment (never in a config that verifiers writes into its traces)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator

import httpx
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic_config import BaseConfig


class DoorConfig(BaseConfig):
    server: str = "http://127.0.0.1:8000"
    """The case-env server (`case-env serve --protocols verl,mcp --bank BANK`)."""
    env: str = "imaging"
    """The hosted environment whose rows and tools are used."""
    token_var: str = "CASE_ENV_TOKEN"
    """The environment variable holding the server's bearer token (unset: no token sent)."""

    def headers(self) -> dict[str, str]:
        token = os.environ.get(self.token_var)
        return {"Authorization": f"Bearer {token}"} if token else {}


@contextlib.asynccontextmanager
async def session(door: DoorConfig) -> AsyncIterator[Client]:
    """An MCP client of the environment's endpoint, `/mcp/<env>/`."""
    async with httpx2.AsyncClient(headers=door.headers(), timeout=120) as http:
        transport = streamable_http_client(f"{door.server.rstrip('/')}/mcp/{door.env}/", http_client=http)
        async with Client(transport) as client:
            yield client


async def structured(client: Client, tool: str, arguments: dict) -> dict:
    """A door tool's structured answer; its refusal (which names the fix) raised as an error."""
    result = await client.call_tool(tool, arguments)
    text = " ".join(getattr(block, "text", "") for block in result.content)
    if result.is_error:
        raise RuntimeError(f"case-env refused {tool}: {text}")
    return result.structured_content or json.loads(text)


def rows(door: DoorConfig, split: str | None, offset: int, limit: int) -> dict:
    """One page of the served bank's rows (keys, prompts, tools; never the answers)."""
    params = {"offset": offset, "limit": limit} | ({"split": split} if split else {})
    response = httpx.get(
        f"{door.server.rstrip('/')}/v1/rows/{door.env}", params=params, headers=door.headers(), timeout=60
    )
    if response.status_code != 200:
        try:
            reason = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = response.text[:300]
        fix = f"; set {door.token_var} to the server's token" if response.status_code == 401 else ""
        raise RuntimeError(
            f"case-env at {door.server} refused the rows ({response.status_code}): {reason}{fix}"
        )
    return response.json()
