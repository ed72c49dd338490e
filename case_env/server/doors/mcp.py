"""The MCP door: each hosted environment as a streamable-HTTP MCP server at `/mcp/<env>/` (the official `mcp`
SDK), for agent frameworks and frontier-model clients.

It lists the environment's tools with the schemas `/v1/tools` serves, beside two of its own: `start_episode`
binds a new episode to a bank row (`row`, or `split` and `index`) or to a case (`case_id`) and returns its
`episode_id` and the row's prompt; `finish_episode` takes the final answer and returns the row's reward.
MCP's current protocol (2026-07-28) keeps no session between requests, so every tool takes the
`episode_id` as one more argument; calls run within that episode's case through the tool route
(`doors.episodes`), images come back as MCP image content, and the server's bearer token guards the endpoint
like every other route.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from fastapi import FastAPI
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from case_env.core.environment import Environment
from case_env.server.doors.episodes import DoorEpisode, DoorError

START, FINISH, EPISODE = "start_episode", "finish_episode", "episode_id"
START_DOC = (
    "Start an episode on a bank row (row, or split and index) or a case (case_id); returns its episode_id, "
    "which every other tool takes, and the row's prompt."
)
_START_SCHEMA = {
    "type": "object",
    "properties": {
        "row": {"type": "string", "description": "A bank row's key (e.g. test-00003)."},
        "split": {"type": "string", "description": "A split of the served bank (default test)."},
        "index": {"type": "integer", "minimum": 0, "description": "The row's position in the split."},
        "case_id": {"type": "string", "description": "A case, without a row (no reward at the end)."},
        "episode_id": {
            "type": "string",
            "description": "An id of your own for the episode (default: a new one).",
        },
    },
}
_FINISH_SCHEMA = {
    "type": "object",
    "properties": {
        "episode_id": {"type": "string", "description": "The id start_episode returned."},
        "answer": {"type": "string", "description": "The final message, with its answer tags."},
    },
    "required": ["episode_id", "answer"],
}


def _scoped(parameters: dict) -> dict:
    """A tool's parameters with the episode's id, which MCP's stateless requests carry in every call."""
    properties = {EPISODE: {"type": "string", "description": f"The id {START} returned."}}
    properties.update(parameters.get("properties") or {})
    return {
        **parameters,
        "properties": properties,
        "required": [EPISODE, *(parameters.get("required") or ())],
    }


def _text(text: str, error: bool = False, **structured: Any) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        is_error=error,
        structured_content=structured or None,
    )


class CaseMCP:
    """One environment's MCP server and the episodes it started, by id."""

    def __init__(self, app: FastAPI, env: Environment, max_sessions: int, idle_s: float):
        self.app, self.env = app, env
        self.episodes: dict[str, DoorEpisode] = {}
        self.kept = 2 * max_sessions
        self._listed: list[types.Tool] | None = None
        self._schemas: dict[str, dict] = {}  # by tool name, built with the listing
        self.server = Server(
            f"case-env-{env.name}",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            # without it the SDK runs the whole tools/list for every call to check one tool's schema
            get_tool_input_schema=self.input_schema,
        )
        # the server binds loopback by default; a caller's Host is checked by the token gate, not here
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        self.sessions = StreamableHTTPSessionManager(
            app=self.server,
            security_settings=security,
            json_response=True,  # one JSON answer per request: no event stream to hold open
            session_idle_timeout=idle_s,
            max_sessions=max_sessions,
        )

    def tools(self) -> list[types.Tool]:
        """The listing, built once: the tools and their schemas are fixed when the server starts."""
        if self._listed is None:
            state = self.app.state.server
            listed = [
                types.Tool(name=START, description=START_DOC, input_schema=_START_SCHEMA),
                types.Tool(
                    name=FINISH,
                    description="End the episode with the final answer.",
                    input_schema=_FINISH_SCHEMA,
                ),
            ]
            for name in self.env.tools:
                function = state.tools[name].openai_schema()["function"]
                description = function.get("description") or name
                listed.append(
                    types.Tool(
                        name=name, description=description, input_schema=_scoped(function["parameters"])
                    )
                )
            self._listed = listed
            self._schemas = {tool.name: tool.input_schema for tool in listed}
        return self._listed

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools())

    def input_schema(self, name: str) -> dict | None:
        """One tool's schema, looked up on every call (the SDK checks `Mcp-Param-*` headers against it)."""
        self.tools()
        return self._schemas.get(name)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        try:
            if params.name == START:
                return self._start(arguments)
            episode_id = arguments.pop(EPISODE, None)
            episode = self.episodes.get(episode_id) if isinstance(episode_id, str) else None
            if episode is None:
                raise DoorError(
                    f"unknown {EPISODE} {episode_id!r}: call {START} and pass the {EPISODE} it returns"
                )
            if params.name == FINISH:
                reward = await episode.finish(str(arguments.get("answer", "")))
                return _text(json.dumps(reward, default=str), **reward)
            reply = await episode.call(params.name, arguments)
        except DoorError as exc:
            return _text(f"Error: {exc}", error=True)
        content: list[Any] = [types.TextContent(type="text", text=reply.model_text())]
        content += [
            types.ImageContent(type="image", data=image["data_b64"], mime_type=image["mime"])
            for image in reply.payload.get("images") or []
        ]
        return types.CallToolResult(content=content, is_error=not reply.ok)

    def _start(self, arguments: dict) -> types.CallToolResult:
        index = arguments.get("index")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
            raise DoorError(f"index must be an integer, not {index!r}")
        case_id = arguments.get("case_id")
        item = None
        if case_id is None:
            item = self.app.state.door_rows.pick(
                self.env.name, arguments.get("row"), arguments.get("split"), index, None
            )
        episode = DoorEpisode.start(self.app.state.server, self.env, item, case_id, arguments.get(EPISODE))
        self.episodes[episode.episode_id] = episode
        while len(self.episodes) > self.kept:  # episodes never finished: the oldest go first
            del self.episodes[next(iter(self.episodes))]
        listing = {EPISODE: episode.episode_id, "case_id": episode.case_id, "tools": episode.tools}
        return _text(json.dumps({**listing, "prompt": episode.prompt}), **listing, prompt=episode.prompt)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.sessions.run():
            yield


def install(app: FastAPI, hosted: dict[str, Environment], max_sessions: int, idle_s: float) -> list[CaseMCP]:
    """Mount each environment's MCP endpoint at /mcp/<env>/; the lifespan runs each one's session manager."""
    servers = []
    for name, env in hosted.items():
        server = CaseMCP(app, env, max_sessions, idle_s)
        app.mount(f"/mcp/{name}", StreamableHTTPASGIApp(server.sessions))
        servers.append(server)
    return servers
