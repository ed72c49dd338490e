"""The one client of the tool server: calls a tool with one retry policy, for the verl adapter and eval alike.

Service faults (429, 5xx, connection errors, timeouts) are retried with exponential backoff that honours
Retry-After (spread over [1, 2) x so refused callers do not return as one herd), within an overall deadline;
model faults come back from the server as 200 with `ok: false` and are never retried; other refusals (403
scope, 404 unknown case, 422 malformed) are final. verl has no tool timeout and no retry of its own, so
this client owns both (docs/architecture.md, "verl's limits").

A client is bound to the event loop that first uses it (httpx connections are); callers that run on several
loops keep one per loop (`LoopClients`).
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


class RetryPolicy(BaseModel):
    """How long and how often a call is tried. Also the `config:` block of each tool in the verl tool YAML."""

    model_config = ConfigDict(extra="ignore")

    base_url: str = Field("http://127.0.0.1:8000", description="Where the case-env server listens.")
    token_env: str = Field(
        "CASE_ENV_TOKEN",
        description="Environment variable holding the bearer token; where it is unset, the same name with "
        "_FILE appended names a file holding it (a secret that must stay out of a job's printed config).",
    )
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
    max_concurrency: int = Field(64, ge=1, description="Calls in flight from one client.")


@dataclass
class Reply:
    """How a call ended: `status` is ok, a model-fault code, `http_<n>` or a transport failure."""

    status: str
    attempts: int
    http_status: int | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    infra_error: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def text(self) -> str:
        """The server's text (its answer, or its one-line reason)."""
        error = self.payload.get("error") or {}
        return self.payload.get("text") or (error.get("message", "") if isinstance(error, dict) else "")

    def model_text(self) -> str:
        """What the model reads: the answer, or an error it can act on."""
        if self.http_status == 200:
            return self.text if self.ok else f"Error: {self.text}"
        if self.http_status is not None and self.http_status not in RETRYABLE_STATUS:
            message = self.text or f"HTTP {self.http_status}"
            return f"Error: the case-env service refused the call ({message})."
        return (
            f"Error: the case-env service did not answer ({self.status}). Try again later, or answer with "
            "the evidence you already have."
        )

    def pngs(self) -> list[bytes]:
        return [base64.b64decode(item["data_b64"]) for item in self.payload.get("images") or []]

    @classmethod
    def answered(cls, http_status: int, payload: Any, attempts: int = 1) -> Reply:
        """The reply of a call the server answered: its `ok` or fault code on 200, else `http_<n>`."""
        payload = payload if isinstance(payload, dict) else {}
        if http_status == 200:
            error = payload.get("error") or {}
            return cls("ok" if payload.get("ok") else error.get("code", "error"), attempts, 200, payload)
        return cls(f"http_{http_status}", attempts, http_status, payload, infra_error=True)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def bearer_token(policy: RetryPolicy) -> str | None:
    """The token from `token_env`, else from the file `<token_env>_FILE` names (first line, stripped)."""
    token = os.environ.get(policy.token_env)
    if token:
        return token
    path = os.environ.get(f"{policy.token_env}_FILE")
    if not path:
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.readline().strip() or None


class ToolClient:
    def __init__(self, policy: RetryPolicy, token: str | None = None):
        self.policy = policy
        token = token if token is not None else bearer_token(policy)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        n = policy.max_concurrency
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        self.http = httpx.AsyncClient(
            base_url=policy.base_url, timeout=policy.timeout_s, limits=limits, headers=headers
        )
        self.semaphore = asyncio.Semaphore(n)

    async def get(self, path: str) -> dict[str, Any]:
        reply = await self.http.get(path)
        reply.raise_for_status()
        return reply.json()

    async def call(self, tool: str, body: dict[str, Any]) -> Reply:
        policy = self.policy
        started = time.monotonic()
        status = "unavailable"
        http_status = None
        attempt = 0
        for attempt in range(policy.retries + 1):
            remaining = policy.deadline_s - (time.monotonic() - started)
            if remaining <= 0:
                status = "deadline"
                break
            retry_after = None
            try:
                async with self.semaphore:
                    reply = await self.http.post(
                        f"/v1/tools/{tool}", json=body, timeout=min(policy.timeout_s, remaining)
                    )
            except httpx.TimeoutException:
                status, http_status = "timeout", None
            except httpx.TransportError:
                status, http_status = "connection_error", None
            else:
                http_status = reply.status_code
                try:
                    payload = reply.json()
                except ValueError:
                    payload = {}
                if reply.status_code == 200 or reply.status_code not in RETRYABLE_STATUS:
                    return Reply.answered(reply.status_code, payload, attempt + 1)
                status = f"http_{reply.status_code}"
                retry_after = _seconds(reply.headers.get("retry-after"))
            if attempt == policy.retries:
                break
            pause = min(policy.max_backoff_s, policy.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
            if retry_after is not None:  # a floor, spread so refused callers do not return as one herd
                pause = max(pause, min(retry_after * random.uniform(1.0, 2.0), policy.max_backoff_s))
            await asyncio.sleep(min(pause, max(0.0, policy.deadline_s - (time.monotonic() - started))))
        return Reply(status, attempt + 1, http_status, infra_error=True)

    async def aclose(self) -> None:
        await self.http.aclose()


class LoopClients:
    """One `ToolClient` per event loop, forgotten with its loop (a new loop may reuse a closed one's id)."""

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ToolClient] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> ToolClient:
        loop = asyncio.get_running_loop()
        client = self._by_loop.get(loop)
        if client is None:
            client = self._by_loop[loop] = ToolClient(self.policy)
        return client
