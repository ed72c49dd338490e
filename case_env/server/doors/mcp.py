"""The MCP door: each hosted environment as a streamable-HTTP MCP server at `/mcp/<env>/` (the official `mcp`
SDK), for agent frameworks and frontier-model clients.

It lists the environment's tools with the schemas `/v1/tools` serves, beside two of its own: `start_episode`
binds a new episode to a bank row (`row`, or `split` and `index`) or to a case (`case_id`) and returns its
`episode_id` and the row's prompt; `finish_episode` takes the final answer and returns the row's reward.
MCP's current protocol (2026-07-28) keeps no session between requests, so every tool takes the
`episode_id` as one more argument; calls run within that episode's case through the tool route
(`doors.episodes`), images come back as MCP image content, and the server's bearer token guards the endpoint
like every other route. Episodes live in the server's store, not in the door: any worker answers any
call, a live episode is never dropped for a newer one, and an ended one is never reopened.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from fastapi import FastAPI
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route

from case_env.core.environment import Environment
from case_env.server.doors.episodes import DoorEpisode, DoorError, Start
from case_env.server.settings import ServerSettings

log = logging.getLogger("case_env.server")
START, FINISH, EPISODE = "start_episode", "finish_episode", "episode_id"
START_DOC = (
    "Start an episode on a bank row (row, or split and index) or a case (case_id); returns its episode_id, "
    "which every other tool takes, and the row's prompt."
)
_START_SCHEMA = Start.model_json_schema()
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


def _result(text: str, error: bool = False, images: list[dict] | None = None, **structured: Any) -> dict:
    """A tool's result in MCP's wire form, which the SDK's runner checks against the protocol's result type
    and shapes."""
    content = [{"type": "text", "text": text}]
    content += [{"type": "image", "data": i["data_b64"], "mimeType": i["mime"]} for i in images or ()]
    result: dict[str, Any] = {"content": content, "isError": error, "resultType": "complete"}
    if structured:
        result["structuredContent"] = structured
    return result


class CaseMCP:
    """One environment's MCP server."""

    def __init__(self, app: FastAPI, env: Environment, max_sessions: int, idle_s: float):
        self.app, self.env = app, env
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

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> dict[str, Any]:
        arguments = dict(params.arguments or {})
        state, rows = self.app.state.server, self.app.state.door_rows
        try:
            if params.name == START:
                episode = await DoorEpisode.start(state, self.env, rows, Start.of(arguments))
                listing = {EPISODE: episode.episode_id, "case_id": episode.case_id, "tools": episode.tools}
                prompt = episode.prompt
                return _result(json.dumps({**listing, "prompt": prompt}), **listing, prompt=prompt)
            episode = await DoorEpisode.find(state, self.env, rows, arguments.pop(EPISODE, None), START)
            if params.name == FINISH:
                answer = arguments.get("answer")
                if not isinstance(answer, str):
                    raise DoorError("answer must be the final message, as text")
                reward = await episode.finish(answer)
                return _result(json.dumps(reward, default=str), **reward)
            reply = await episode.call(params.name, arguments)
        except DoorError as exc:
            return _result(f"Error: {exc}", error=True)
        return _result(reply.model_text(), not reply.ok, reply.payload.get("images"))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.sessions.run():
            yield


def install(app: FastAPI, hosted: dict[str, Environment], settings: ServerSettings) -> list[CaseMCP]:
    """Serve each environment's MCP endpoint at exactly /mcp/<env>/ (a route, not a mount: no path below it
    is the endpoint), for POST: the streamable transport lets a server refuse GET and DELETE (405), and a
    client then goes on without a stream of its own; the lifespan runs each one's session manager."""
    servers = []
    for name, env in hosted.items():
        server = CaseMCP(app, env, settings.max_in_flight * 4, settings.episode_idle_s)
        endpoint = StreamableHTTPASGIApp(server.sessions)
        app.router.routes.append(Route(f"/mcp/{name}/", endpoint, methods=["POST"]))
        servers.append(server)
    return servers
