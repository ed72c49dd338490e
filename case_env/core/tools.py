"""The tool framework: what a tool is, how tools are found, described and called.

A tool is a typed function in an environment's tool package (`tools/<env>/`), decorated with
`@tool(personas=...)`: its name is the function's, its description the docstring, its arguments the
parameters after the context, each a scalar or an enum with a `Field` (verl passes on only `type`,
`description` and `enum`; anything else is refused at load). Options tell the server how to run it:
`renders` (in the render pool), `remember` (the caller keeps its answer for later calls), `inline` (on the
event loop), `resident` (on the loop while its data is in memory); an `async def` tool is awaited. A module
may define `TOOLS` instead, specs built from a table. Tools are pure functions of (case data, arguments,
episode context): the case comes from the call, never from an argument, so any worker answers any call.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import pkgutil
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo

from case_env.core.control import excerpt


class ErrorCode(StrEnum):
    """Why a call failed. Model faults come back as `ok: false` text; service faults as HTTP statuses. An
    environment names its own model faults with its own codes (any string a `ToolError` carries, listed in its
    `Evaluation.fault_codes`); every `ToolError` is a model fault, whatever its code."""

    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
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
    EPISODE_ENDED = "episode_ended"


MODEL_FAULTS = frozenset(
    {
        ErrorCode.INVALID_ARGUMENTS,
        ErrorCode.UNKNOWN_TOOL,
        ErrorCode.NOT_AVAILABLE,
        ErrorCode.NOT_RECORDED,
    }
)


class ToolError(Exception):
    """A problem the model caused and can correct: becomes `ok: false` with this one-line message."""

    def __init__(self, code: str, message: str):
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
    # a sample (a language model asked afresh), not a function of the call: never cached nor shared
    sampled: bool = False
    # the model this tool asks did not answer and its deterministic stand-in did (why, in a few words):
    # counted in /metrics and written to the episode log, and, like a sample, neither cached nor shared
    fallback: str | None = None


@dataclass
class ToolContext:
    """What a handler may touch: this call's case (`case_id`) among its environment's `cases`, and the
    episode context the caller sent, validated by the environment's context model (None when it has none).
    Environments subclass it with the accessors their tools share."""

    cases: Any
    case_id: str
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
    # the fields of the episode context its answer depends on (None: all of them); the server's response
    # cache keys on these alone, so calls whose contexts differ elsewhere share one answer
    depends_on: tuple[str, ...] | None = None
    # the handler is a coroutine function (it awaits a language model): the server awaits it on its event
    # loop, so episodes waiting on a model hold no thread and never queue other calls behind them
    awaits: bool = False

    @functools.cached_property
    def context_fields(self) -> set[str] | None:
        """`depends_on` as pydantic's `include` takes it (None: every field)."""
        return set(self.depends_on) if self.depends_on is not None else None

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


MAX_PROBLEMS = 8  # a message a model reads: the first few problems name what to fix


def describe_invalid(exc: ValidationError, spec: ToolSpec) -> str:
    """One line a model can act on, naming the valid values."""
    valid_args = ", ".join(spec.args.model_fields) or "none"
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        kind = error["type"]
        prop = spec.parameters["properties"].get(where, {})
        if kind == "missing":
            problems.append(f"missing argument {where!r}")  # a schema's field, not model text
        elif kind == "extra_forbidden":
            problems.append(f"unknown argument {excerpt(where)} (valid arguments: {valid_args})")
        elif kind == "enum" or "enum" in prop:
            problems.append(
                f"{where} must be one of {', '.join(prop.get('enum', []))}, not {excerpt(error.get('input'))}"
            )
        elif kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            problems.append(f"{where} is out of range: {error['msg'].lower()}")
        elif kind in ("model_type", "dict_type"):
            problems.append(f"arguments must be a JSON object with keys {valid_args}")
        else:
            problems.append(f"{where}: {error['msg'].lower()}")
    return f"invalid arguments for {spec.name}: " + "; ".join(problems[:MAX_PROBLEMS])


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
    depends_on: tuple[str, ...] | None = None,
    awaits: bool = False,
) -> ToolSpec:
    """One tool, checked: its Args forbid extra fields and hold scalars and enums only."""
    if args.model_config.get("extra") != "forbid":
        raise TypeError(f"tool {name}: Args must forbid extra fields")
    if inline and renders:
        raise TypeError(f"tool {name}: a tool that renders cannot run inline")
    parameters = function_parameters(name, args)
    return ToolSpec(
        # persona names as plain strings (an environment may name them with its StrEnum)
        name,
        description,
        tuple(str(p) for p in personas),
        args,
        run,
        parameters,
        renders,
        remember,
        inline,
        resident,
        depends_on,
        awaits,
    )


def tool(
    *,
    personas: tuple[str, ...],
    renders: bool = False,
    remember: bool = False,
    inline: bool = False,
    resident: bool = False,
    depends_on: tuple[str, ...] | None = None,
) -> Callable[[Callable[..., ToolResult]], ToolSpec]:
    """A tool from a typed function `f(ctx, **arguments) -> ToolResult` (see the module's docstring)."""

    def made(function: Callable[..., ToolResult]) -> ToolSpec:
        name = function.__name__
        hints = typing.get_type_hints(function, include_extras=True)
        fields: dict[str, Any] = {}
        for parameter in list(inspect.signature(function).parameters.values())[1:]:
            if parameter.name not in hints:
                raise TypeError(f"tool {name}: argument {parameter.name!r} has no type")
            default = parameter.default
            if default is inspect.Parameter.empty:
                default = ...
            elif not isinstance(default, FieldInfo):
                raise TypeError(f"tool {name}: argument {parameter.name!r} needs a Field with a description")
            fields[parameter.name] = (hints[parameter.name], default)
        args = create_model(f"{name}_args", __config__=ConfigDict(extra="forbid"), **fields)
        description = " ".join(line.strip() for line in inspect.cleandoc(function.__doc__ or "").splitlines())
        if not description:
            raise TypeError(f"tool {name}: its docstring is its description, and it has none")

        awaits = inspect.iscoroutinefunction(function)
        if awaits and (renders or inline or resident):
            raise TypeError(
                f"tool {name}: a coroutine tool is awaited on the loop; renders/inline/resident do not apply"
            )

        def run(ctx: ToolContext, arguments: BaseModel) -> ToolResult:
            return function(ctx, **arguments.__dict__)

        run.__wrapped__ = function  # type: ignore[attr-defined]
        return tool_spec(
            name, description, personas, args, run, renders, remember, inline, resident, depends_on, awaits
        )

    return made


def package_modules(package: str) -> Iterator[ModuleType]:
    """The modules of an environment's tool or persona package, in name order (modules whose names start with
    an underscore are helpers)."""
    pkg = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not info.name.startswith("_") and not info.ispkg:
            yield importlib.import_module(f"{package}.{info.name}")


def load_tools(package: str) -> dict[str, ToolSpec]:
    """Every tool of the package: the `@tool` functions of each module, or its `TOOLS` table."""
    specs: dict[str, ToolSpec] = {}
    for module in package_modules(package):
        found = getattr(module, "TOOLS", None) or [
            v for v in vars(module).values() if isinstance(v, ToolSpec)
        ]
        if not found:
            raise TypeError(f"{module.__name__} defines no tool (a @tool function or TOOLS)")
        for spec in found:
            if spec.name in specs:
                raise TypeError(f"tool {spec.name} is defined twice in {package}")
            specs[spec.name] = spec
    return specs


class ToolSet(dict[str, ToolSpec]):
    """An environment's tools by name, in the order they are offered."""


class FromPackage:
    """An environment's table declared as the package it is loaded from: read on an instance, loaded once
    (the loaded table then shadows this descriptor on the instance)."""

    def __init__(self, package: str):
        self.package = package

    def __set_name__(self, owner: type, name: str) -> None:
        self.attribute = name

    def __get__(self, env: Any, owner: type | None = None) -> Any:
        if env is None:
            return self
        loaded = env.__dict__[self.attribute] = self.load(env)
        return loaded

    def load(self, env: Any) -> dict:
        raise NotImplementedError


class Tools(FromPackage):
    """`tools = Tools("package")`: the package's tools by name."""

    def load(self, env: Any) -> ToolSet:
        return ToolSet(load_tools(self.package))


def schema_version(tools: dict[str, ToolSpec]) -> str:
    """A short hash of every schema served; banks record it to detect drift between prompts and server."""
    blob = json.dumps([t.openai_schema() for t in tools.values()], sort_keys=True).encode()
    return hashlib.blake2b(blob, digest_size=6).hexdigest()
