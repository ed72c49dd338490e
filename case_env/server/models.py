"""Wire models of HTTP API v1. Field descriptions feed /openapi.json."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from case_env.core.calls import Call

EPISODE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
CASE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


class ErrorInfo(BaseModel):
    # a shared code (ErrorCode) or a model fault of the call's environment (`Evaluation.fault_codes`);
    # /openapi.json lists the hosted ones (server/contract.py)
    code: str = Field(description="Machine-readable reason.")
    message: str = Field(description="One line, readable by a model or a person; never a path or traceback.")


class ErrorResponse(BaseModel):
    ok: bool = Field(False, description="Always false.")
    error: ErrorInfo


class ToolCallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    episode_id: str = Field(
        pattern=EPISODE_ID_PATTERN,
        description="Stable id of the trajectory (verl's agent_data.request_id). The first call binds it to "
        "its case; a later call naming another case is refused.",
    )
    patient_id: str = Field(
        pattern=CASE_ID_PATTERN,
        description="Public case id (e.g. case0001), from the dataset row: the CASE schema calls it "
        "patient_id.",
    )
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="The tool's arguments, as the model gave them."
    )
    context: dict[str, Any] | None = Field(
        None,
        description="The row's settings for its episode (from its create_kwargs: a noise plan, an attempt "
        "budget), sent by the adapter, never by the model. The first call's are kept with the episode and a "
        "later call must send the same (403); the episode's history is the server's own log, never sent. "
        "Validated by the environment's context model (422 naming the problem); environments without one "
        "take none.",
    )

    @field_validator("arguments", "context")
    @classmethod
    def _bounded_text(cls, value: Any, info: ValidationInfo) -> Any:
        """Arguments and context nest at most MAX_DEPTH levels and hold at most MAX_NODES values: a call that
        nested 300 levels once passed here and then failed the episode log's serialiser, losing the other
        episodes' calls of that flush. JSON may also spell a lone surrogate (\\ud800) that no
        UTF-8 text can hold; refuse it here, before it reaches a tool, the audit log or the response encoder.
        pydantic's own JSON parser refuses one already (the fast path's `model_validate_json`); `json.loads`,
        which FastAPI's route uses, does not."""
        _check_shape(value, surrogates=info.mode != "json")
        return value


MAX_DEPTH = 16  # a tool's arguments are scalars and enums (docs/architecture.md); context nests a few levels
MAX_NODES = 4096
# characters of text in a call's arguments (and in its context): the HTTP body limit's 64 KiB, so a call that
# reaches the tools through a door's larger frames is bounded alike, and the logs take no more of it
MAX_TEXT = 65536


def _check_shape(value: Any, surrogates: bool) -> None:
    pending = [(value, 0)]  # iterative: the JSON parser allows deeper nesting than Python's stack
    nodes = text = 0
    while pending:
        item, depth = pending.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ValueError(f"more than {MAX_NODES} values")
        if isinstance(item, str):
            text += len(item)
            if text > MAX_TEXT:
                raise ValueError(f"more than {MAX_TEXT} characters of text")
            if surrogates:
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError("text must be valid Unicode (found a lone surrogate)") from None
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)


class ImagePayload(BaseModel):
    mime: str = Field(description="Media type, image/png.")
    width: int = Field(description="Width in pixels.")
    height: int = Field(description="Height in pixels.")
    data_b64: str = Field(description="Base64-encoded image bytes.")


class ToolCallResponse(BaseModel):
    ok: bool = Field(description="True when the tool answered; false when the call failed (see error).")
    tool: str = Field(description="The tool called.")
    episode_id: str = Field(description="The episode of the call.")
    text: str = Field(description="What the model sees: the answer, or the error message.")
    images: list[ImagePayload] = Field(default_factory=list, description="Images returned with the text.")
    error: ErrorInfo | None = Field(None, description="Set when ok is false.")
    latency_ms: float = Field(description="Server time spent on the call.")


class ToolInfo(BaseModel):
    name: str
    env: str = Field(description="The environment the tool belongs to.")
    personas: list[str] = Field(description="Personas whose tool subset includes this tool.")
    schema_: dict = Field(
        alias="schema", description="OpenAI function schema, as verl's tool config takes it."
    )

    model_config = ConfigDict(populate_by_name=True)


class EnvironmentInfo(BaseModel):
    name: str = Field(description="The environment's name (a bank row's extra_info.env).")
    title: str
    personas: list[str]
    data_sources: list[str]
    tools: list[str]
    schema_version: str = Field(description="Hash of this environment's schemas (banks record it).")


class ToolsResponse(BaseModel):
    schema_version: str = Field(
        description="Hash of the schemas listed; changes whenever one of them changes."
    )
    tools: list[ToolInfo]
    environments: list[EnvironmentInfo] = Field(description="The environments whose tools are listed.")


class EpisodeResponse(BaseModel):
    episode_id: str
    patient_id: str
    env: str = Field(description="The environment of its case.")
    created: float = Field(description="Unix time of the first call.")
    last_seen: float = Field(description="Unix time of the latest call.")
    calls_total: int = Field(description="Calls made in the episode, including those no longer kept.")
    calls: list[Call] = Field(description="The most recent calls, oldest first.")
    ended: bool = Field(False, description="A door scored its final answer: the episode takes no more calls.")
    reward: dict[str, Any] | None = Field(None, description="The reward it ended with (the first one given).")


class HealthResponse(BaseModel):
    status: str = "ok"
    version: str


class ReadyResponse(BaseModel):
    ready: bool
    patients: int = Field(description="Cases found in the data root.")
    reason: str | None = Field(None, description="Why the server is not ready.")
    store: str = Field(description="Where episodes live: sqlite (one host) or redis (shared by replicas).")
    episodes_live: int | None = Field(None, description="Episodes bound and not ended (None: store down).")
    max_episodes: int = Field(
        description="Episodes kept at most; past it the least recently used go first, ended ones first."
    )
    episode_idle_s: float = Field(description="An episode without a call for this long expires.")
