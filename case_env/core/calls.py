"""The tool calls of an episode, as they ran: what rewards that count calls read.

The verl adapter (and the eval runner, the same way) appends one record per executed call to
`agent_data.extra_fields["case_env_tool_calls"]`; verl 0.9.1 merges `extra_fields` into the reward's
`extra_info`, so the reward sees the calls that really ran, with their status, in whatever format the model
wrote them. Only when that field is absent (a transcript scored on its own, `POST /v1/score`) are the calls
read back from the text, in both formats verl's tool parsers accept: `hermes`, a JSON object in
`<tool_call>` tags, and `qwen3_coder`, Qwen3's XML form
`<tool_call><function=NAME><parameter=P>V</parameter></function></tool_call>`. Tool responses are removed
before reading, so a tool output can neither order nor hide a call.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Self

from pydantic import AllowInfNan, BaseModel, ConfigDict, Field, Strict

from case_env.core.answers import model_text
from case_env.core.tags import Tagged

FIELD = "case_env_tool_calls"
FORMATS = ("hermes", "qwen3_coder")
TOOL_CALL = Tagged("<tool_call>", "</tool_call>")
# Names are read up to 256 characters: `[^>\n]*` scanned to the end of the text from every `<parameter=` of a
# body that never closes one, quadratic in a looping model's output (docs/architecture.md, "The reward").
_FUNCTION = re.compile(r"<function=([^>\n]{0,256})>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]{0,256})>(.*?)(?:</parameter>|$)", re.DOTALL)


class Call(BaseModel):
    """One tool call of an episode as it ran, in the one shape every part uses: the server's episode log holds
    it, `GET /v1/episodes/{id}` answers it, a client keeps it beside its trajectory (`FIELD`), and rewards that
    count calls read it. Strict, as /openapi.json describes it: "3" is not a number of attempts."""

    model_config = ConfigDict(extra="allow", strict=True)

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict, description="As the model gave them.")
    status: str = Field(
        "ok", description="ok, a model-fault code (the call was refused), or an infrastructure status."
    )
    http_status: int | None = Field(
        None, description="The server's HTTP status; none when it never answered."
    )
    latency_ms: float = Field(0.0, description="Time spent on the call: the server's, or the caller's wait.")
    text: str | None = Field(None, description="The answer, kept for tools whose later calls read it.")
    fallback: str | None = Field(
        None, description="Why the tool's rules answered instead of its language model, if they did."
    )
    output_digest: str | None = Field(
        None, description="SHA-256 of the text and image bytes returned, its first 128 bits in hex."
    )
    seq: int | None = Field(None, description="1-based position of the call in its episode (server).")
    time: float | None = Field(None, description="Unix time the call finished (server).")
    infra_error: bool = Field(
        False, description="The service failed the call (client): not the model's fault."
    )
    attempts: int = Field(1, description="HTTP attempts the client made (client).")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def record(self) -> dict[str, Any]:
        """As JSON-ready data, without the fields no one set."""
        return self.model_dump(exclude_none=True)


def decoded(value: Any) -> Any:
    """A block of `extra_info` stored as a JSON string (MedExAgent's parquet, some banks) as its object."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise ValueError("a string that is not JSON (an object, or its JSON text, is expected)") from None


def whole_numbers(value: Any) -> Any:
    """`value` with every float that is a whole number as an int: JSON has one number type, and JSON Schema
    calls 40.0 an integer, so the strict models that read a row's or a call's JSON take it as 40 (a string
    "40" stays a string, and is still refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


# a trajectory's calls a reward reads at most: verl's loops make one or a few per turn, a few dozen turns
MAX_SCORED_CALLS = 1024


# a reward weight as /openapi.json says it: a finite number, never a string or a boolean
Weight = Annotated[float, Strict(), AllowInfNan(False)]


class ScoreExtra(BaseModel):
    """The part of a row's `extra_info` every reward may read: its environment and the episode's executed
    calls. An environment's reward that reads more subclasses it (`Environment.score_extra`); a row that does
    not validate is the caller's fault (422 at `/v1/score`, a ValueError naming the field in verl)."""

    model_config = ConfigDict(extra="allow")

    env: str | None = None
    case_env_tool_calls: list[Call] | None = Field(None, max_length=MAX_SCORED_CALLS)
    reward_weights: dict[str, Weight] | None = Field(
        None,
        max_length=64,
        description="The row's weight of each reward component it names (`case-env envs` lists them); the "
        "others keep their environment's default.",
    )

    @classmethod
    def read(cls, extra: BaseModel | Mapping[str, Any] | None) -> Self:
        """`extra` as this model: passed through when the reward's entry validated it (`reward.scorer` gives
        every environment the row's one validated `extra_info`), validated here once for a caller of a
        reward function with a plain dict."""
        if isinstance(extra, cls):
            return extra
        if isinstance(extra, BaseModel):
            extra = extra.model_dump()
        return cls.model_validate(whole_numbers(dict(extra or {})))


# what parsing a model's text may raise besides a syntax error: nesting deeper than the interpreter's stack
# ("[[[[..." or "1+1+...+1"); verl's parsers catch every Exception, so such a call is unparsed, never a crash
UNPARSABLE = (ValueError, SyntaxError, RecursionError, MemoryError)


def _convert(value: str, kind: str | None) -> Any:
    """A qwen3_coder parameter value by its schema type, as verl's Qwen3XMLToolParser converts it."""
    if value.lower() == "null":
        return None
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            number = float(value)
            return int(number) if number == int(number) else number
    except ValueError:
        return value
    if kind == "boolean":
        return value.lower() == "true"
    if kind in ("object", "array"):
        try:
            return json.loads(value)
        except UNPARSABLE:
            try:
                return ast.literal_eval(value)
            except UNPARSABLE:
                return value
    return value


def _xml_call(body: str, schemas: dict[str, dict]) -> tuple[str, dict] | None:
    function = _FUNCTION.search(body)
    if function is None:
        return None
    name = function.group(1).strip()
    types = {k: v.get("type") for k, v in (schemas.get(name) or {}).items()}
    arguments = {}
    for parameter, raw in _PARAMETER.findall(function.group(2)):
        value = raw[1:] if raw.startswith("\n") else raw
        value = value[:-1] if value.endswith("\n") else value
        arguments[parameter.strip()] = _convert(value, types.get(parameter.strip()))
    return name, arguments


def _json_call(body: str) -> tuple[str, dict] | None:
    try:
        call = json.loads(body)
    except UNPARSABLE:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments")
    return call["name"], arguments if isinstance(arguments, dict) else {}


def chat_call(call: dict) -> tuple[str, Any]:
    """(name, arguments) of a tool call in a chat message, in the OpenAI shape: `function.arguments` JSON text,
    parsed (empty text as `{}`), or already an object; None when the text is not JSON, as a model may write
    it. Whether the arguments must be an object is the caller's to say."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str) or arguments is None:
        try:
            arguments = json.loads(arguments or "{}")
        except UNPARSABLE:
            arguments = None
    return str(function.get("name", "")), arguments


def written_calls(solution_str: str, schemas: dict[str, dict] | None = None) -> list[tuple[str, dict]]:
    """(name, arguments) of every tool call the model wrote, in order, in either format. `schemas` maps a
    tool name to its parameters' properties, for typing XML values (strings without it)."""
    calls = []
    for body in TOOL_CALL.findall(model_text(solution_str)):
        call = _xml_call(body, schemas or {}) if "<function=" in body else _json_call(body)
        if call is not None:
            calls.append(call)
    return calls


def executed_calls(
    solution_str: str, recorded: Sequence[Call] | None, parameters: Callable[[], dict[str, dict]]
) -> list[Call]:
    """The episode's calls: as they ran (`extra_info`'s, validated) when recorded, else as written in the text,
    their values typed by `parameters()` (the tools' parameter schemas by name; read only when needed)."""
    if recorded is not None:
        return list(recorded)
    written = written_calls(solution_str, parameters())
    return [Call(tool=name, arguments=arguments) for name, arguments in written]


def call_text(name: str, arguments: dict, form: str = "hermes") -> str:
    """A tool call as a model writes it, in one of verl's parser formats."""
    if form == "qwen3_coder":
        parameters = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in arguments.items()
        )
        return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"
    if form != "hermes":
        raise ValueError(f"unknown tool-call format {form!r}; choose {' or '.join(FORMATS)}")
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
