"""A small client for OpenAI-compatible chat endpoints, at temperature 0 by default and with a persistent cache.

Used where an environment may consult a language model (a simulated patient, a judge of answers). Rewards must
not drift between runs and a GRPO group must see one answer, so every answer is cached on disk by a hash of
(model, messages, parameters): the second time the same question is asked, the endpoint is not. A caller
reproducing a published system samples as it did: MedExAgent's patient and judge ran at 0.7 and were asked
afresh every time (`fresh=True`); its callers keep the cached single sample as an option for rewards that
stay a function of the trajectory.
A failure (timeout, HTTP error, malformed reply) returns None and is never cached; callers fall back to
their deterministic rules.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import httpx
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger("case_env.core.llm")


class LLMSettings(BaseModel):
    base_url: str = Field(description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1.")
    model: str = Field(description="Model name sent with each request.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key.")
    timeout_s: float = Field(10.0, gt=0, description="Per-request timeout; past it the caller falls back.")
    max_tokens: int = Field(256, ge=1, description="Longest reply.")
    temperature: float = Field(
        0.0, ge=0, le=2, description="Sampling temperature; a cached reply is reused at any temperature."
    )
    cache_path: Path | None = Field(None, description="SQLite cache file; None keeps the cache in memory.")


@dataclass(frozen=True)
class Reply:
    text: str
    cached: bool


class ChatClient:
    def __init__(self, settings: LLMSettings):
        self.settings = settings
        key = os.environ.get(settings.api_key_env, "")
        self._http = httpx.Client(
            base_url=settings.base_url.rstrip("/"),
            timeout=settings.timeout_s,
            headers={"Authorization": f"Bearer {key}"} if key else {},
        )
        self._lock = threading.Lock()
        path = settings.cache_path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path) if path else ":memory:", check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, text TEXT NOT NULL)")
        self.requests = 0  # sent to the endpoint (cache misses), for metrics and tests

    def _key(self, messages: list[dict], temperature: float) -> str:
        blob = json.dumps(
            [self.settings.model, self.settings.max_tokens, temperature, messages], sort_keys=True
        )
        return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()

    def complete(
        self, messages: list[dict], temperature: float | None = None, fresh: bool = False
    ) -> Reply | None:
        """The reply to `messages` (at the settings' temperature unless one is given), or None on failure.
        `fresh`: a new sample, neither read from the cache nor kept in it (a published system that samples
        its judge or patient anew on every call)."""
        temperature = self.settings.temperature if temperature is None else temperature
        key = self._key(messages, temperature)
        if not fresh:
            with self._lock:
                row = self._db.execute("SELECT text FROM replies WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return Reply(row[0], cached=True)
        body = {
            "model": self.settings.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": self.settings.max_tokens,
        }
        self.requests += 1
        try:
            reply = self._http.post("/chat/completions", json=body)
            reply.raise_for_status()
            text = reply.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            log.warning("LLM endpoint failed (%s); falling back", type(exc).__name__)
            return None
        if not isinstance(text, str) or not text.strip():
            return None
        if fresh:
            return Reply(text, cached=False)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO replies (key, text) VALUES (?, ?)", (key, text))
            self._db.commit()
        return Reply(text, cached=False)

    def close(self) -> None:
        self._http.close()
        self._db.close()


class JudgeSettings(BaseSettings):
    """The optional answer judge of the text environments (CASE_ENV_JUDGE_URL, CASE_ENV_JUDGE_MODEL,
    CASE_ENV_JUDGE_TIMEOUT_S, CASE_ENV_JUDGE_CACHE); off when no URL is set."""

    model_config = SettingsConfigDict(env_prefix="CASE_ENV_JUDGE_", extra="ignore")

    url: str | None = None
    model: str = "gpt-4.1-mini"
    timeout_s: float = 20.0
    cache: str | None = None


@cache
def default_judge() -> ChatClient | None:
    """One judge client per process (CASE_ENV_JUDGE_*), shared by every reward and tool that asks a judge."""
    settings = JudgeSettings()
    if not settings.url:
        return None
    return ChatClient(
        LLMSettings(
            base_url=settings.url,
            model=settings.model,
            timeout_s=settings.timeout_s,
            max_tokens=64,
            cache_path=Path(settings.cache) if settings.cache else None,
        )
    )
