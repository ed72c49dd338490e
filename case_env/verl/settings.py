"""Settings of the verl adapter: the `config:` block of each tool entry in verl's tool YAML.

Kept apart from `CaseTool` (which imports verl) so that the YAML generator and the CLI read the same
defaults without importing verl.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AdapterConfig(BaseModel):
    """The `config:` block of a tool entry in the verl tool YAML."""

    model_config = ConfigDict(extra="ignore")

    base_url: str = Field("http://127.0.0.1:8000", description="Where the case-env server listens.")
    token_env: str = Field("CASE_ENV_TOKEN", description="Environment variable holding the bearer token.")
    timeout_s: float = Field(30.0, gt=0, description="Timeout of one HTTP attempt.")
    deadline_s: float = Field(120.0, gt=0, description="Time budget of a call including all retries.")
    retries: int = Field(
        8,
        ge=0,
        description="Retries after the first attempt, on 429/5xx/connection errors. With the default backoff "
        "they span about 40 s, enough to ride out an overload burst or a server restart.",
    )
    backoff_s: float = Field(0.5, ge=0, description="First backoff; doubles per retry, with jitter.")
    max_backoff_s: float = Field(8.0, ge=0, description="Longest single backoff (also caps Retry-After).")
    max_concurrency: int = Field(64, ge=1, description="Calls in flight from one AgentLoopWorker.")
