"""The tool framework: what a tool module provides, how tools are found, described and called.

A tool is a module in an environment's tool package (`tools/<env>/`, installed as `case_env.tools.<env>`)
with `NAME`, `DESCRIPTION`, `PERSONAS`, a pydantic `Args` model and `run(ctx, args) -> ToolResult`;
optionally `RENDERS = True` (it draws images, so it runs in the render pool), `REMEMBER = True` (later
calls of the same episode need its answer, so the caller keeps it; see `Environment.episode_context`),
`INLINE = True` (it answers from memory and never blocks, so it runs on the event loop) and `RESIDENT = True`
(every read goes through a store that guards its I/O, so the server first tries it on the event loop and
falls back to the pool when data is not yet in memory; see `case_env.core.resident`).
A module may instead define `TOOLS`, a list of `ToolSpec` built from a table (`tool_spec` makes one), when
many tools share one handler and differ only in data.
Tools are pure functions of (case data, arguments, episode context): the case comes from the call, never
from an argument, so no tool schema has a patient field and any worker can answer any call.

verl keeps only `type`, `description` and `enum` of each parameter (docs/architecture.md, "verl's limits"),
so `Args` may hold scalars and enums only; the loader refuses anything else at load time, and the schema
served to models is reduced to exactly what verl passes on.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ValidationError


class ErrorCode(StrEnum):
    """Why a call failed. Model faults come back as `ok: false` text; service faults as HTTP statuses."""

    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    UNKNOWN_ORGAN = "unknown_organ"
    UNKNOWN_VISIT = "unknown_visit"
    NOT_AVAILABLE = "not_available"
    UNKNOWN_PATIENT = "unknown_patient"
    SCOPE_VIOLATION = "scope_violation"
    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"
    OVERLOADED = "overloaded"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NOT_READY = "not_ready"
    DATA_UNAVAILABLE = "data_unavailable"
    INTERNAL = "internal"
    NOT_RECORDED = "not_recorded"


MODEL_FAULTS = frozenset(
    {
        ErrorCode.INVALID_ARGUMENTS,
        ErrorCode.UNKNOWN_TOOL,
        ErrorCode.UNKNOWN_ORGAN,
        ErrorCode.UNKNOWN_VISIT,
        ErrorCode.NOT_AVAILABLE,
        ErrorCode.NOT_RECORDED,
    }
)


class ToolError(Exception):
    """A problem the model caused and can correct: becomes `ok: false` with this one-line message."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ToolImage:
    png: bytes
    width: int
    height: int
    mime: str = "image/png"


@dataclass(frozen=True)
class ToolResult:
    text: str
    images: tuple[ToolImage, ...] = ()


@dataclass
class ToolContext:
    """What a handler may touch: this call's case (`patient_id`) in its environment's `store`, and the
    episode context the caller sent, validated by the environment's context model (None when it has none).
    Environments subclass it with the accessors their tools share."""

    store: Any
    patient_id: str
    episode: Any = None


Handler = Callable[[ToolContext, Any], ToolResult]
_SCALAR_TYPES = {"string", "integer", "number", "boolean"}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    personas: tuple[str, ...]
    args: type[BaseModel]
    run: Handler
    parameters: dict = field(default_factory=dict)
    renders: bool = False  # draws images: runs in the render pool, so text tools never queue behind it
    remember: bool = False  # later calls of the episode need this call's answer (the caller keeps it)
    # answers from memory in microseconds: runs on the event loop, since a hop to a pool thread and back
    # costs the server more than the call (no file is read, nothing can block)
    inline: bool = False
    # reads only through a store that calls `require_resident` before any I/O: tried on the event loop
    # first, in the pool when that raises (case_env.core.resident)
    resident: bool = False

    def openai_schema(self) -> dict:
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}

    def parse(self, arguments: dict[str, Any]) -> BaseModel:
        try:
            return self.args.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(ErrorCode.INVALID_ARGUMENTS, describe_invalid(exc, self)) from None


def canonical_arguments(args: BaseModel) -> str:
    """Parsed arguments as one string, defaults filled in and keys sorted: two spellings of the same call
    (`40` and `40.0`, an omitted default and the default given) are the same call. Keys recorded replays and
    cached responses."""
    return json.dumps(args.model_dump(mode="json"), sort_keys=True)


def _resolve(prop: dict, defs: dict) -> dict:
    """Inline $ref / allOf / Optional (anyOf with null) so that a property is a plain JSON type."""
    if "$ref" in prop:
        return {**defs[prop["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in prop.items() if k != "$ref"}}
    if "allOf" in prop and len(prop["allOf"]) == 1:
        return {**_resolve(prop["allOf"][0], defs), **{k: v for k, v in prop.items() if k != "allOf"}}
    if "anyOf" in prop:
        options = [o for o in prop["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            return {**_resolve(options[0], defs), **{k: v for k, v in prop.items() if k != "anyOf"}}
    return prop


def function_parameters(name: str, model: type[BaseModel]) -> dict:
    """OpenAI function parameters of an Args model, reduced to type, description and enum."""
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    properties = {}
    for arg, raw in schema.get("properties", {}).items():
        prop = _resolve(raw, defs)
        kind = prop.get("type")
        if kind not in _SCALAR_TYPES:
            raise TypeError(f"tool {name}: argument {arg!r} must be a scalar or an enum, not {raw}")
        entry: dict[str, Any] = {
            "type": kind,
            "description": raw.get("description", prop.get("description", "")),
        }
        if "enum" in prop:
            entry["enum"] = list(prop["enum"])
        properties[arg] = entry
    return {"type": "object", "properties": properties, "required": list(schema.get("required", []))}


def describe_invalid(exc: ValidationError, spec: ToolSpec) -> str:
    """One line a model can act on, naming the valid values."""
    valid_args = ", ".join(spec.args.model_fields) or "none"
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        kind = error["type"]
        prop = spec.parameters["properties"].get(where, {})
        if kind == "missing":
            problems.append(f"missing argument {where!r}")
        elif kind == "extra_forbidden":
            problems.append(f"unknown argument {where!r} (valid arguments: {valid_args})")
        elif kind == "enum" or "enum" in prop:
            problems.append(
                f"{where} must be one of {', '.join(prop.get('enum', []))}, not {error.get('input')!r}"
            )
        elif kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            problems.append(f"{where} is out of range: {error['msg'].lower()}")
        elif kind in ("model_type", "dict_type"):
            problems.append(f"arguments must be a JSON object with keys {valid_args}")
        else:
            problems.append(f"{where}: {error['msg'].lower()}")
    return f"invalid arguments for {spec.name}: " + "; ".join(problems)


def tool_spec(
    name: str,
    description: str,
    personas: tuple[str, ...],
    args: type[BaseModel],
    run: Handler,
    renders: bool = False,
    remember: bool = False,
    inline: bool = False,
    resident: bool = False,
) -> ToolSpec:
    """One tool, checked: its Args forbid extra fields and hold scalars and enums only."""
    if args.model_config.get("extra") != "forbid":
        raise TypeError(f"tool {name}: Args must forbid extra fields")
    if inline and renders:
        raise TypeError(f"tool {name}: a tool that renders cannot run inline")
    parameters = function_parameters(name, args)
    return ToolSpec(
        name, description, tuple(personas), args, run, parameters, renders, remember, inline, resident
    )


def spec_from_module(module: Any) -> ToolSpec:
    return tool_spec(
        module.NAME,
        module.DESCRIPTION,
        tuple(str(p) for p in module.PERSONAS),
        module.Args,
        module.run,
        getattr(module, "RENDERS", False),
        getattr(module, "REMEMBER", False),
        getattr(module, "INLINE", False),
        getattr(module, "RESIDENT", False),
    )


def load_tools(package: str) -> dict[str, ToolSpec]:
    """Every tool module of the package (modules whose names start with an underscore are helpers)."""
    pkg = importlib.import_module(package)
    specs = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.ispkg:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        # A family module builds many tools from one table (`TOOLS`, a list of ToolSpec) instead of one.
        for spec in getattr(module, "TOOLS", None) or [spec_from_module(module)]:
            if spec.name in specs:
                raise TypeError(f"tool {spec.name} is defined twice in {package}")
            specs[spec.name] = spec
    return specs


def schema_version(tools: dict[str, ToolSpec]) -> str:
    """A short hash of every schema served; banks record it to detect drift between prompts and server."""
    blob = json.dumps([t.openai_schema() for t in tools.values()], sort_keys=True).encode()
    return hashlib.blake2b(blob, digest_size=6).hexdigest()
