"""A client for OpenAI-compatible chat endpoints: asynchronous underneath, bounded per endpoint, with a cache.

Used where an environment consults a language model (a simulated patient, a judge) at a training step's
scale: 1,024 episodes or rewards waiting at once. Per process, each endpoint (base URL and key) has one
`Endpoint`: one openai SDK client, at most `concurrency` requests in flight and a queue, every request
bounded by the caller's `timeout_s` and retried by the SDK (connection errors, 429, 5xx) while that lasts. The
endpoints run on an event loop of their own in a daemon thread, shared by the server's loop, verl's reward
loop and plain threads: `acomplete` awaits, `complete` blocks the calling thread.

Replies are cached on disk by a hash of (model, messages, parameters), so rewards do not drift, unless asked
`fresh` (a system that samples anew on every call, as MedExAgent's patient and judge at 0.7). A failure
returns None, never cached; callers fall back to their rules. Rewards are coroutines that await their judge
(`asked_judge`); past a deadline, `judge_silenced` lets the rules decide.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger("case_env.core.llm")
T = TypeVar("T")
# ours: about what one vLLM server batches at once; set it to the endpoint's `--max-num-seqs`. Past the server's
# own batch, requests wait in its queue, where they cost more than in ours (held, and timed against its timeout)
DEFAULT_CONCURRENCY = 256


_ANSWER_BY: ContextVar[float | None] = ContextVar("case_env_answer_by", default=None)


@contextmanager
def answer_within(seconds: float) -> Iterator[None]:
    """Requests made inside give up after at most `seconds` (from now), whatever their own timeout: a caller
    with a deadline of its own (a tool call) keeps the time to answer by its fallback."""
    token = _ANSWER_BY.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _ANSWER_BY.reset(token)


def _budget(timeout_s: float) -> float:
    answer_by = _ANSWER_BY.get()
    return timeout_s if answer_by is None else min(timeout_s, answer_by - time.monotonic())


class LLMSettings(BaseModel):
    base_url: str = Field(description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1.")
    model: str = Field(description="Model name sent with each request.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key.")
    timeout_s: float = Field(
        10.0, gt=0, description="What one reply may take, its wait in the queue included; past it, fallback."
    )
    max_tokens: int = Field(256, ge=1, description="Longest reply.")
    temperature: float = Field(
        0.0, ge=0, le=2, description="Sampling temperature; a cached reply is reused at any temperature."
    )
    cache_path: Path | None = Field(None, description="SQLite cache file; None keeps the cache in memory.")
    concurrency: int = Field(
        DEFAULT_CONCURRENCY, ge=1, description="Requests in flight to the endpoint from this process."
    )
    retries: int = Field(
        2, ge=0, description="Attempts after a failed one (the SDK's: connection error, 408, 409, 429, 5xx)."
    )


@dataclass(frozen=True)
class ModelReply:
    """A chat model's answer, and whether the on-disk cache gave it."""

    text: str
    cached: bool


class _Loop:
    """The event loop the endpoints run on, in a daemon thread of this process (made again after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="case-env-llm", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
                _ENDPOINTS.clear()  # a forked child's endpoints belonged to its parent's loop
            return self._loop


_LOOP = _Loop()


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """The coroutine's result, run on the endpoints' loop, blocking this (non-loop) thread until it is done."""
    loop = _LOOP.get()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coroutine.close()
        raise RuntimeError("run_sync called on the endpoints' own loop; await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


async def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """The coroutine's result, run on the endpoints' loop and awaited from whichever loop is running."""
    loop = _LOOP.get()
    if asyncio.get_running_loop() is loop:
        return await coroutine
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))


@dataclass
class EndpointStats:
    """What `/metrics` shows of an endpoint: its requests in the queue and in flight now."""

    waiting: int = 0
    in_flight: int = 0


@dataclass
class Endpoint:
    """One endpoint's client (the openai SDK), its bound on requests in flight and the queue behind it. Made on
    the endpoints' loop and used only there."""

    base_url: str
    key: str
    concurrency: int
    stats: EndpointStats = field(default_factory=EndpointStats)

    def __post_init__(self) -> None:
        import openai  # here, not at import: it costs every `case-env` command and server 0.4 s to load

        # The SDK on its aiohttp transport: 1.4-1.7 ms of CPU per request at 64 in flight against 2.3 on its
        # default httpx2 pool (docs/sources.md). Its pool (1,000 connections) is wider than any bound here:
        # `_slots` alone bounds the requests.
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.key or "none", http_client=openai.DefaultAioHttpClient()
        )
        self._by_retries: dict[int, Any] = {}
        self._slots = asyncio.Semaphore(self.concurrency)

    def widen(self, concurrency: int) -> None:
        """Raise the bound to `concurrency` (two clients of one endpoint asked for different bounds: the larger
        stands, since the pool is one)."""
        for _ in range(concurrency - self.concurrency):
            self._slots.release()
        self.concurrency = max(self.concurrency, concurrency)

    async def post(self, request: dict, timeout_s: float, retries: int) -> str | None:
        """The reply's text, or None when no attempt succeeded within `timeout_s` (the queue's wait counted).
        The SDK retries connection errors, 408, 409, 429 and 5xx `retries` times, with its own backoff."""
        import openai

        deadline = time.monotonic() + timeout_s
        stats = self.stats
        stats.waiting += 1
        try:
            async with asyncio.timeout(timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            stats.waiting -= 1
            return self._failed(f"no free slot within {timeout_s:g} s")
        stats.waiting -= 1
        stats.in_flight += 1
        try:
            client = self._by_retries.get(retries)
            if client is None:
                client = self._by_retries[retries] = self._client.with_options(max_retries=retries)
            remaining = deadline - time.monotonic()
            async with asyncio.timeout(remaining):  # the SDK's timeout is one attempt's; this bounds them all
                reply = await client.chat.completions.create(**request, timeout=remaining)
            text = reply.choices[0].message.content
        except openai.APIStatusError as exc:
            return self._failed(f"HTTP {exc.status_code}")
        except (openai.OpenAIError, TimeoutError) as exc:
            return self._failed(type(exc).__name__)
        except (AttributeError, IndexError, TypeError) as exc:
            return self._failed(f"malformed reply ({type(exc).__name__})")
        finally:
            stats.in_flight -= 1
            self._slots.release()
        if not isinstance(text, str) or not text.strip():
            return self._failed("empty reply")
        return text

    def _failed(self, reason: str) -> None:
        log.warning("LLM endpoint %s failed (%s); falling back", self.base_url, reason)
        return None


_ENDPOINTS: dict[tuple[str, str], Endpoint] = {}


async def _endpoint(base_url: str, key: str, concurrency: int) -> Endpoint:
    found = _ENDPOINTS.get((base_url, key))
    if found is None:
        found = _ENDPOINTS[(base_url, key)] = Endpoint(base_url, key, concurrency)
    elif concurrency > found.concurrency:
        found.widen(concurrency)
    return found


async def _close_endpoints() -> None:
    for endpoint in list(_ENDPOINTS.values()):
        await endpoint._client.close()
    _ENDPOINTS.clear()


@atexit.register
def close_endpoints() -> None:
    """Close every endpoint's connections (at exit: aiohttp warns of sessions left open)."""
    loop = _LOOP._loop
    if loop is None or _LOOP._pid != os.getpid() or not loop.is_running():
        return
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(_close_endpoints(), loop).result(timeout=5)


def endpoint_stats() -> dict[str, EndpointStats]:
    """Each endpoint of this process by URL (for metrics and benchmarks)."""
    return {endpoint.base_url: endpoint.stats for endpoint in list(_ENDPOINTS.values())}


class Asker(Protocol):
    """What a reward or a patient asks a model through: a `ChatClient`, or a stand-in holding its replies."""

    async def acomplete(
        self, messages: list[dict], temperature: float | None = None, fresh: bool = False
    ) -> ModelReply | None: ...


class ChatClient:
    """A model at one endpoint with its settings and reply cache; `complete` for threads, `acomplete` for
    coroutines, both through the endpoint's one pool and bound."""

    def __init__(self, settings: LLMSettings):
        self.settings = settings
        self._base_url = settings.base_url.rstrip("/")
        self._key = os.environ.get(settings.api_key_env, "")
        self._lock = threading.Lock()
        path = settings.cache_path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path) if path else ":memory:", check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, text TEXT NOT NULL)")
        self.requests = 0  # sent to the endpoint (cache misses), for metrics and tests

    def key(self, messages: list[dict], temperature: float | None = None) -> str:
        temperature = self.settings.temperature if temperature is None else temperature
        blob = json.dumps(
            [self.settings.model, self.settings.max_tokens, temperature, messages], sort_keys=True
        )
        return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()

    def complete(
        self, messages: list[dict], temperature: float | None = None, fresh: bool = False
    ) -> ModelReply | None:
        """The reply to `messages` (at the settings' temperature unless one is given), or None on failure.
        `fresh`: a new sample, neither read from the cache nor kept in it (a published system that samples
        its judge or patient anew on every call). Blocks this thread; never call it on a running loop."""
        return run_sync(self.acomplete(messages, temperature, fresh))

    async def acomplete(
        self, messages: list[dict], temperature: float | None = None, fresh: bool = False
    ) -> ModelReply | None:
        """`complete` for a coroutine: awaits the reply without holding a thread."""
        temperature = self.settings.temperature if temperature is None else temperature
        key = self.key(messages, temperature)
        if not fresh:
            with self._lock:
                row = self._db.execute("SELECT text FROM replies WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return ModelReply(row[0], cached=True)
        body = {
            "model": self.settings.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": self.settings.max_tokens,
        }
        budget = _budget(self.settings.timeout_s)
        if budget <= 0:
            return None
        self.requests += 1
        text = await run_async(self._post(body, budget))
        if text is None:
            return None
        if not fresh:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO replies (key, text) VALUES (?, ?)", (key, text))
                self._db.commit()
        return ModelReply(text, cached=False)

    async def _post(self, body: dict, timeout_s: float) -> str | None:
        s = self.settings
        endpoint = await _endpoint(self._base_url, self._key, s.concurrency)
        return await endpoint.post(body, timeout_s, s.retries)

    def close(self) -> None:
        self._db.close()


class JudgeSettings(BaseSettings):
    """The optional answer judge of the text environments (CASE_ENV_JUDGE_URL, CASE_ENV_JUDGE_MODEL,
    CASE_ENV_JUDGE_TIMEOUT_S, CASE_ENV_JUDGE_CONCURRENCY, CASE_ENV_JUDGE_RETRIES, CASE_ENV_JUDGE_CACHE); off
    when no URL is set."""

    model_config = SettingsConfigDict(env_prefix="CASE_ENV_JUDGE_", extra="ignore")

    url: str | None = None
    model: str = "gpt-4.1-mini"
    timeout_s: float = 20.0
    concurrency: int = Field(DEFAULT_CONCURRENCY, ge=1)
    retries: int = Field(2, ge=0)
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
            concurrency=settings.concurrency,
            retries=settings.retries,
        )
    )


# how a reward says its judge was asked and its rules stood in: no reply, or one out of form
FALLBACKS = frozenset({"unavailable", "rejected"})


def fell_back(by: str) -> float:
    """1.0 when a judged grade came from the rules because the judge failed (`FALLBACKS`), else 0.0: a number,
    which verl logs each step, where it logs no string."""
    return float(by in FALLBACKS)


_ASKING: ContextVar[Asker | None] = ContextVar("case_env_judge_asking", default=None)


def asked_judge() -> Asker | None:
    """The judge a reward asks: the process's (`default_judge`), or none that answers inside
    `judge_silenced`."""
    return _ASKING.get() or default_judge()


class _Silent:
    """A judge that never answers: each judged grade falls back to the rules, marked `unavailable`."""

    async def acomplete(
        self, messages: list[dict], temperature: float | None = None, fresh: bool = False
    ) -> ModelReply | None:
        return None


@contextmanager
def judge_silenced() -> Iterator[None]:
    """Rewards scored inside ask no judge: past a deadline, the deterministic fallback decides at once."""
    token = _ASKING.set(_Silent())
    try:
        yield
    finally:
        _ASKING.reset(token)
