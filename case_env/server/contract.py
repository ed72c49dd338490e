"""/openapi.json as the server behaves: what a client may send is what the server accepts.

FastAPI documents the routes as written, and two are generic: `POST /v1/tools/{name}` takes any tool name and
a `context` of any shape, `GET /v1/tools?env=` any string, and `/v1/score` any `extra_info`. The server is
stricter, as it should be, so a client reading the document (schemathesis did) met refusals of
requests the document allowed. Here the document is rewritten from what the server hosts: one path per tool,
whose body carries the context model of the tool's environment (or no context), `env` as the hosted names,
and `extra_info` as the rewards' model (`registry.row_extra`). The generic route still answers every call,
and an unknown tool still gets its model-fault answer; it is left out of the document because no client
should call it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.routing import Mount, Route

from case_env.core import registry
from case_env.core.environment import Environment
from case_env.core.tools import ErrorCode

GENERIC = "/v1/tools/{name}"


def install(app: FastAPI, hosted: dict[str, Environment], tool_env: dict[str, str]) -> None:
    """Replace the app's OpenAPI document by one rewritten for what it hosts (built once, on first use)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = copy.deepcopy(build())
            _hosted_names(schema, hosted)
            _tool_paths(schema, hosted, tool_env)
            _score_rows(schema)
            _error_codes(schema, hosted)
            _doors(schema, app)
            _security(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _component(schema: dict, model: type[BaseModel]) -> dict:
    """A `$ref` to `model`, its schema (and those it refers to) added to the components."""
    found = model.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(found.pop("$defs", {}))
    components[model.__name__] = found
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _hosted_names(schema: dict, hosted: dict[str, Environment]) -> None:
    for parameter in schema["paths"]["/v1/tools"]["get"].get("parameters", []):
        if parameter["name"] == "env":
            names = {"type": "string", "enum": sorted(hosted)}
            parameter["schema"] = {**parameter["schema"], "anyOf": [names, {"type": "null"}]}


def _tool_paths(schema: dict, hosted: dict[str, Environment], tool_env: dict[str, str]) -> None:
    from case_env.server.models import ToolCallRequest  # the route reads its body itself: no component yet

    generic = schema["paths"].pop(GENERIC)["post"]
    _component(schema, ToolCallRequest)
    components = schema["components"]["schemas"]
    request = components.pop("ToolCallRequest")
    bodies = {}
    for name, env in hosted.items():
        body = copy.deepcopy(request)
        body["title"] = f"ToolCall_{name}"
        if env.context_model is None:
            del body["properties"]["context"]  # the body forbids other keys: a context is refused
        else:
            context = _component(schema, env.context_model)
            body["properties"]["context"] = {
                **body["properties"]["context"],
                "anyOf": [context, {"type": "null"}],
            }
        components[body["title"]] = body
        bodies[name] = {"$ref": f"#/components/schemas/{body['title']}"}
    for tool, owner in sorted(tool_env.items(), key=lambda item: (item[1], item[0])):
        operation = copy.deepcopy(generic)
        spec = hosted[owner].tools[tool]
        operation["operationId"] = f"call_{tool}"
        operation["summary"] = f"{tool} ({hosted[owner].title})"
        operation["description"] = spec.description
        operation["parameters"] = [p for p in operation.get("parameters", []) if p["name"] != "name"]
        operation["requestBody"]["content"]["application/json"]["schema"] = bodies[owner]
        schema["paths"][f"/v1/tools/{tool}"] = {"post": operation}


def _score_rows(schema: dict) -> None:
    from case_env.server.routes.score import ScoreRequest  # the route reads its body raw: no component yet

    _component(schema, ScoreRequest)
    request = schema["components"]["schemas"]["ScoreRequest"]
    extra = request["properties"]["extra_info"]
    extra["anyOf"] = [_component(schema, registry.row_extra()), {"type": "null"}]


def _security(schema: dict) -> None:
    """The bearer token on every route but the liveness probe, as the token gate asks for it (`auth.py`)."""
    from case_env.server.auth import guarded

    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["HTTPBearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "The server's token (CASE_ENV_TOKEN), when one is set.",
    }
    for path, operations in schema["paths"].items():
        if guarded(path):
            for operation in operations.values():
                operation["security"] = [{"HTTPBearer": []}]


def _error_codes(schema: dict, hosted: dict[str, Environment]) -> None:
    codes = [*map(str, ErrorCode), *registry.own_faults(hosted.values())]
    info = schema["components"]["schemas"]["ErrorInfo"]["properties"]["code"]
    info["enum"] = list(dict.fromkeys(codes))


MCP_OPERATION = {
    "tags": ["mcp"],
    "summary": "MCP streamable HTTP (JSON-RPC): tools/list, tools/call",
    "description": "An MCP client's endpoint (the Model Context Protocol's streamable HTTP transport).",
    "security": [{"HTTPBearer": []}],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "A JSON-RPC 2.0 request or notification, with MCP's headers "
                    "(Mcp-Protocol-Version; Accept naming application/json and text/event-stream).",
                    "properties": {
                        "jsonrpc": {"type": "string", "enum": ["2.0"]},
                        "id": {"type": ["string", "integer"]},
                        "method": {"type": "string"},
                        "params": {"type": "object"},
                    },
                    "required": ["jsonrpc", "method"],
                }
            }
        },
    },
    "responses": {
        "200": {"description": "A JSON-RPC answer (a result or an error), as JSON or an event stream."},
        "202": {"description": "A notification or response accepted."},
        "400": {"description": "Not a JSON-RPC request the protocol takes, or a header that contradicts it."},
        "401": {"description": "Missing or wrong bearer token."},
        "404": {"description": "An unknown or expired MCP session."},
        "405": {"description": "A method the endpoint does not serve."},
        "406": {"description": "An Accept header without application/json or text/event-stream."},
        "413": {"description": "Request body too large."},
        "415": {"description": "A body that is not application/json."},
        "422": {"description": "A request of a protocol version the endpoint does not take."},
    },
}


def _doors(schema: dict, app: FastAPI) -> None:
    """The doors' routes: an OpenEnv app's own document under its mount (its schemas renamed where a name is
    the server's own), an MCP endpoint as one operation."""
    for route in app.routes:
        if isinstance(route, Route) and route.path.startswith("/mcp/"):
            schema["paths"][route.path] = {"post": copy.deepcopy(MCP_OPERATION)}
            continue
        if not isinstance(route, Mount):
            continue
        door = getattr(route.app, "app", route.app)  # the app behind a door's guard (FrameGuard)
        if not isinstance(door, FastAPI):
            continue
        components = schema["components"]["schemas"]
        mounted = door.openapi()
        text = json.dumps(mounted)
        for name, found in mounted.get("components", {}).get("schemas", {}).items():
            if name in components and components[name] != found:  # two schemas, one name: theirs renamed
                text = text.replace(f'"#/components/schemas/{name}"', f'"#/components/schemas/OpenEnv{name}"')
        mounted = json.loads(text)
        for name, found in mounted.get("components", {}).get("schemas", {}).items():
            renamed = name if name not in components or components[name] == found else f"OpenEnv{name}"
            components[renamed] = found
        for path, operations in mounted.get("paths", {}).items():
            for operation in operations.values():
                operation["tags"] = ["openenv"]
                operation["operationId"] = (
                    f"{route.path.strip('/').replace('/', '_')}_{operation.get('operationId', path)}"
                )
                operation["security"] = [{"HTTPBearer": []}]
                operation.setdefault("responses", {})["401"] = {
                    "description": "Missing or wrong bearer token."
                }
            schema["paths"][route.path + path] = operations
