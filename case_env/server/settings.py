"""Settings of the HTTP service (`CASE_ENV_*` environment variables or `case-env serve` options).

The data root and cache directory live in `case_env.settings.DataSettings`; an environment's own data settings in
its package.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from case_env.settings import ScoreSettings

PROTOCOLS = ("verl", "openenv", "mcp")


class ServerSettings(ScoreSettings):
    model_config = SettingsConfigDict(env_prefix="CASE_ENV_", extra="ignore")

    host: str = Field("127.0.0.1", description="Bind address; a non-loopback address requires a token.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port.")
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes.")
    token: SecretStr | None = Field(
        None, min_length=8, description="Bearer token required on every /v1 route and /metrics."
    )
    max_in_flight: int = Field(256, ge=1, description="Calls served at once per worker; others queue.")
    max_queued: int = Field(
        1024,
        ge=0,
        description="Calls waiting for a slot per worker; a call that finds the queue full gets 429.",
    )
    max_awaiting: int = Field(
        4096,
        ge=1,
        description="Calls waiting on a language model (an LLM patient) at once per worker, admitted apart "
        "from max_in_flight: they hold no thread, so a training step's episodes all fit.",
    )
    queue_wait_s: float = Field(
        2.0, ge=0, description="Longest wait for a slot before 429 (it counts against the call's deadline)."
    )
    retry_after_s: int = Field(1, ge=1, description="Retry-After seconds sent with 429 and 503.")
    tool_deadline_s: float = Field(20.0, gt=0, description="Per-call deadline; past it the call answers 504.")
    head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection's request head must arrive within this of opening or of its last response.",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request's body must arrive within this of its head."
    )
    render_threads: int = Field(
        default_factory=lambda data: max(1, (os.cpu_count() or 1) // data["workers"]),
        ge=1,
        description="Threads per worker that load, render and encode images; default: cores / workers. More "
        "threads than that hold the GIL against the event loop and slow text tools down (docs/performance.md).",
    )
    loop_renders: bool | None = Field(
        None,
        description="Render a warm case on the event loop instead of a render thread (tools that declare "
        "resident=True; a case not yet in memory still goes to the pool). Default: when a worker has one render "
        "thread, whose hand-off cost a fifth of a render's CPU and bought no parallelism.",
    )
    text_threads: int = Field(
        2, ge=1, description="Threads for text tools, so they never wait behind renders."
    )
    episode_idle_s: float = Field(3600.0, gt=0, description="An episode idle this long is forgotten.")
    door_session_idle_s: float = Field(
        30.0,
        gt=0,
        description="An OpenEnv session that no WebSocket holds (one created over its HTTP MCP endpoint) is "
        "closed after this long without a message; the episodes themselves live in the store.",
    )
    max_episodes: int = Field(
        100_000,
        ge=1,
        description="Episodes kept at most; past it the least recently used go first, ended ones before "
        "any live one.",
    )
    max_calls_per_episode: int = Field(
        256, ge=1, description="Calls kept per episode (oldest go first; the count goes on)."
    )
    store: str | None = Field(
        None,
        pattern=r"^rediss?://",
        description="Where episodes live when replicas span hosts: a Redis URL (redis://host:port/db), "
        "shared by every replica. Unset: the SQLite file episode_db.",
    )
    episode_db: Path | None = Field(
        None,
        description="SQLite file the workers of one host share for episodes (bindings, calls, ends), when no "
        "store is set. `case-env serve` defaults to <cache dir>/episodes/<host>-<port>.sqlite, so a restart "
        "keeps every episode; an app built in process without one keeps them in memory.",
    )
    replay_dir: Path | None = Field(
        None,
        description="Serve recorded tool outputs from the trajectory files here instead of the data root.",
    )
    warm_patients: bool = Field(
        True,
        description="Prepare a case in the background when a worker first sees it (its environment's store "
        "decides what that means: decoding a case's volumes, for one).",
    )
    response_cache_mb: int = Field(
        128,
        ge=0,
        description="Memory per worker for answers of repeated pure calls (GRPO groups); 0 disables.",
    )
    audit_log: Path | None = Field(None, description="File that receives one JSON line per call.")
    protocols: str = Field(
        "verl",
        description="The doors served, comma-separated: verl (the tool API every client here uses), openenv "
        "(OpenEnv's reset/step/state under /openenv/<env>), mcp (streamable-HTTP MCP under /mcp/<env>).",
    )
    banks: list[Path] = Field(
        default_factory=list,
        description="Banks (a parquet file or a bank directory) whose rows the openenv and mcp doors start "
        "episodes from; as JSON in CASE_ENV_BANKS.",
    )
    otel: bool = Field(
        False,
        description="FastAPI's own OpenTelemetry spans, metrics and logs per request (needs a configured "
        "OpenTelemetry SDK). Off by default: the per-request check for configured providers alone cost a tenth "
        "of a cheap call's CPU (py-spy profile), and /metrics already counts every call.",
    )

    @field_validator("protocols")
    @classmethod
    def _known(cls, value: str) -> str:
        unknown = [p for p in value.split(",") if p not in PROTOCOLS]
        if unknown:
            raise ValueError(
                f"unknown protocol {unknown[0]!r}; choose from {', '.join(PROTOCOLS)}, comma-separated"
            )
        return value

    @property
    def doors(self) -> tuple[str, ...]:
        """The protocols served besides verl's tool API, each once."""
        return tuple(dict.fromkeys(p for p in self.protocols.split(",") if p != "verl"))

    @property
    def renders_on_loop(self) -> bool:
        """Warm renders run on the event loop: `loop_renders` when set, else when there is one render thread."""
        return self.render_threads == 1 if self.loop_renders is None else self.loop_renders

    max_body_bytes: int = Field(65536, ge=1024, description="Larger request bodies are refused with 413.")
    max_score_body_bytes: int = Field(
        2 * 2**20,
        ge=1024,
        description="Body limit of POST /v1/score, which carries a whole trajectory (200,000 characters of "
        "response at most, escaped for JSON).",
    )
