"""The MCP door: each hosted environment as a streamable-HTTP MCP server at `/mcp/<env>/` (the official `mcp`
SDK), for agent frameworks and frontier-model clients.

It lists the environment's tools with the schemas `/v1/tools` serves, beside two of its own: `start_episode`
binds a new episode to a bank row (`row`, or `split` and `index`) or to a case (`case_id`) and returns its
`episode_id` and the row's prompt; `finish_episode` takes the final answer and returns the row's reward.
MCP's current protocol (2026-07-28) keeps no session between requests, so every tool takes the
`episode_id` as one more argument; calls run within that episode's case through the tool route
(`doors.episodes`), images come back as MCP image content, and the server's bearer token guards the endpoint
like every other route.

A well-formed `tools/call` is answered in front of FastAPI and the SDK's per-request machinery (`CaseMCP.front`,
through `case_env.server.fastpath`): the SDK's own checks, handler and result shaping, without the request,
connection and runner objects it builds for every call, which cost more CPU than the call itself (figures in
docs/performance.md). Anything else, and any request those checks would refuse, goes to the SDK's endpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.runner import modern_error_data
from mcp.server.streamable_http import check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundModernRoute,
    classify_inbound_request,
)
from mcp_types import INTERNAL_ERROR, SERVER_INFO_META_KEY, methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Scope

from case_env.core.environment import Environment
from case_env.server.doors.episodes import DoorEpisode, DoorError
from case_env.server.fastpath import Answer, ToolServer
from case_env.server.routes.tools import with_images
from case_env.server.state import ServerState

log = logging.getLogger("case_env.server")
START, FINISH, EPISODE = "start_episode", "finish_episode", "episode_id"
CALL = "tools/call"
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


def _result(text: str, error: bool = False, images: list[dict] | None = None, **structured: Any) -> dict:
    """A tool's result in MCP's wire form, which the SDK's runner (or the front, with the SDK's function)
    checks against the protocol's result type and shapes."""
    content = [{"type": "text", "text": text}]
    content += [{"type": "image", "data": i["data_b64"], "mimeType": i["mime"]} for i in images or ()]
    result: dict[str, Any] = {"content": content, "isError": error, "resultType": "complete"}
    if structured:
        result["structuredContent"] = structured
    return result


class CaseMCP:
    """One environment's MCP server and the episodes it started, by id."""

    def __init__(self, app: ToolServer, env: Environment, max_sessions: int, idle_s: float):
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
        self.stamp = self.server.server_info_stamp  # what the SDK adds to each result's `_meta`

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
                return _result(json.dumps(reward, default=str), **reward)
            reply = await episode.call(params.name, arguments)
        except DoorError as exc:
            return _result(f"Error: {exc}", error=True)
        return _result(reply.model_text(), not reply.ok, reply.payload.get("images"))

    async def front(self, state: ServerState, scope: Scope, body: bytes) -> Answer | None:
        """A `tools/call` at a modern protocol version answered as the SDK's endpoint answers it, or None for
        a request the SDK's checks would not pass as they stand (it then answers, or refuses, itself)."""
        routed = _routing(scope)
        if routed is None or len(body) > self.sessions.max_request_body_size:
            return None
        version, routing = routed
        try:
            request = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not _tool_call(request):
            return None
        if not isinstance(classify_inbound_request(request, headers=routing), InboundModernRoute):
            return None
        try:  # the SDK's two validations of a call's params, in its order
            methods.validate_client_request(CALL, version, request["params"])
            params = types.CallToolRequestParams.model_validate(request["params"], by_name=False)
        except (ValidationError, KeyError, ValueError):
            return None
        try:
            result = await self.call_tool(None, params)
        except Exception as exc:  # as the SDK's endpoint maps a handler's failure
            return _error(request["id"], exc)
        try:  # the SDK runner's shaping: the version's result surface, then the serverInfo stamp
            shaped = methods.serialize_server_result(CALL, version, result)
        except ValidationError:
            log.exception("%s returned an invalid result", params.name)
            return _error(
                request["id"], MCPError(code=INTERNAL_ERROR, message="Handler returned an invalid result")
            )
        shaped["_meta"] = {SERVER_INFO_META_KEY: self.stamp}
        images = [item for item in shaped.get("content") or () if item.get("type") == "image"]
        encoded = [item["data"].encode() for item in images]  # spliced in, not scanned for escapes
        for item in images:
            item["data"] = ""  # in its place: the key order is the SDK's
        payload = _json({"jsonrpc": "2.0", "id": request["id"], "result": shaped})
        return 200, None, with_images(payload, encoded, b"data") if encoded else payload

    def _start(self, arguments: dict) -> dict[str, Any]:
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
        return _result(json.dumps({**listing, "prompt": episode.prompt}), **listing, prompt=episode.prompt)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.sessions.run():
            yield


def _routing(scope: Scope) -> tuple[str, dict[str, str]] | None:
    """The modern protocol version a request names and its `Mcp-*` headers, if they pass as the SDK's
    endpoint checks them: an Accept taking JSON (the SDK's own reading), each header once, none of them
    `Mcp-Param-*` (checked against a schema)."""
    routing: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name.startswith(b"mcp-"):
            key = name.decode("latin-1")
            if key in routing or name.startswith(b"mcp-param-"):
                return None
            routing[key] = value.decode("latin-1")
    version = routing.get(MCP_PROTOCOL_VERSION_HEADER)
    if version not in MODERN_PROTOCOL_VERSIONS or not check_accept_headers(Request(scope))[0]:
        return None
    return version, routing


def _tool_call(request: Any) -> bool:
    """Whether a decoded body is one JSON-RPC `tools/call` request, its envelope as the SDK's model reads it."""
    return (
        isinstance(request, dict)
        and request.keys() == {"jsonrpc", "id", "method", "params"}
        and request["jsonrpc"] == "2.0"
        and type(request["id"]) in (int, str)
        and request["method"] == CALL
        and isinstance(request["params"], dict)
    )


def _json(document: dict) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def _error(request_id: int | str, exc: Exception) -> Answer:
    """A failed call's JSON-RPC error and HTTP status, as the SDK's endpoint writes them."""
    error = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=modern_error_data(exc))
    status = ERROR_CODE_HTTP_STATUS.get(error.error.code, 200)
    return status, None, _json(error.model_dump(mode="json", by_alias=True, exclude_none=True))


def install(
    app: ToolServer, hosted: dict[str, Environment], max_sessions: int, idle_s: float
) -> list[CaseMCP]:
    """Mount each environment's MCP endpoint at /mcp/<env>/, its `tools/call` answered in front; the lifespan
    runs each one's session manager."""
    servers = []
    for name, env in hosted.items():
        server = CaseMCP(app, env, max_sessions, idle_s)
        app.mount(f"/mcp/{name}", StreamableHTTPASGIApp(server.sessions))
        app.front(f"/mcp/{name}/", server.front)
        servers.append(server)
    return servers
