"""Episode state, owned by the server: each episode's binding, its calls, its end, idle expiry and the cap.

A call names its episode and case and carries the row's settings (its `context`); the server keeps the rest.
The first call of an episode binds it to its case, its environment and those settings (the first writer
wins, atomically, whichever worker or replica it reaches); every call is appended to the episode's log
before its answer leaves, and a tool whose answer depends on the episode so far (a patient's conversation,
an attempt budget) is given a context the environment builds from that log. An episode ended by a door
(its final answer scored) is never reopened, and its reward is the first one.

Two implementations share this interface: SQLite (`sqlite.py`, the embedded default: one file that the
workers of one host share) and Redis (`redis.py`, `CASE_ENV_STORE=redis://host:port/db`: replicas on any
number of hosts share only it). Past `max_episodes`, episodes are evicted least recently used first, ended
ones before any live one; an episode idle for `idle_s` expires.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from case_env.core.calls import Call

KNOWN = 65536  # bindings a worker remembers (a few MB)


class StoreUnavailableError(RuntimeError):
    """The store cannot be reached: the server answers 503 and binds nothing (it never rebinds blind)."""


@dataclass(frozen=True, slots=True)
class Binding:
    """What an episode is bound to by its first call."""

    case_id: str
    env: str
    context: str | None = None  # the row's settings as the first call sent them (JSON), else None
    row: str | None = None  # the bank row a door started the episode from
    ended: bool = False  # a door scored its final answer: no call or start reopens it


@dataclass
class Episode:
    """An episode as `GET /v1/episodes/{id}` shows it."""

    episode_id: str
    binding: Binding
    created: float
    last_seen: float
    calls_total: int
    calls: list[Call] = field(default_factory=list)
    reward: dict[str, Any] | None = None


class EpisodeStore(ABC):
    """Where a server's episodes live. Every method may raise `StoreUnavailableError`."""

    name: str = ""

    def __init__(self, idle_s: float, max_episodes: int, max_calls: int):
        self.idle_s = idle_s
        self.max_episodes = max_episodes
        self.max_calls = max_calls
        # bindings this worker has seen, for calls that need no more than the binding: a binding never changes
        # while its episode lives, and `append` checks it again in the store, so a stale one (an episode
        # ended, or expired and bound anew elsewhere) costs a refused record, never a wrong answer kept; a call
        # naming another case than the one remembered asks the store
        self._known: OrderedDict[str, Binding] = OrderedDict()

    async def bind(
        self,
        episode_id: str,
        binding: Binding,
        now: float,
        with_calls: bool = False,
        remembered: bool = False,
    ) -> tuple[Binding, list[Call]]:
        """The episode's binding: `binding` when the episode is new (this call created it), else the one
        it has; and its calls so far when `with_calls` (oldest first, as many as `max_calls` keeps).
        `remembered`: a binding this worker saw may answer, for a caller whose `append` checks it again."""
        if remembered and not with_calls:
            known = self._known.get(episode_id)
            if known is not None and known == binding:
                self._known.move_to_end(episode_id)
                return known, []
        bound, calls = await self._bind(episode_id, binding, now, with_calls)
        self._known[episode_id] = bound
        if len(self._known) > KNOWN:
            self._known.popitem(last=False)
        return bound, calls

    @abstractmethod
    async def _bind(
        self, episode_id: str, binding: Binding, now: float, with_calls: bool
    ) -> tuple[Binding, list[Call]]: ...

    async def append(self, episode_id: str, case_id: str, call: Call, now: float) -> bool:
        """Record a call of the episode bound to `case_id`, durably enough to outlive a killed worker; False
        when the episode is no longer bound to that case or has ended (nothing recorded)."""
        if await self._append(episode_id, case_id, call, now):
            return True
        known = self._known.pop(episode_id, None)
        if known is None or known.case_id != case_id:
            return False
        # bound from memory: the episode expired or was evicted since. Bind it anew, as the store would have
        # at this call's start, and record the call there
        bound, _ = await self._bind(episode_id, known, now, False)
        return bound == known and await self._append(episode_id, case_id, call, now)

    @abstractmethod
    async def _append(self, episode_id: str, case_id: str, call: Call, now: float) -> bool: ...

    async def end(self, episode_id: str, reward: dict[str, Any], now: float) -> dict[str, Any] | None:
        """End a live episode with its reward; returns the reward it keeps (the first one given), None for
        an unknown episode."""
        self._known.pop(episode_id, None)
        return await self._end(episode_id, reward, now)

    @abstractmethod
    async def _end(self, episode_id: str, reward: dict[str, Any], now: float) -> dict[str, Any] | None: ...

    @abstractmethod
    async def binding(self, episode_id: str) -> Binding | None:
        """The episode's binding, None for an unknown (or expired) episode."""

    @abstractmethod
    async def get(self, episode_id: str) -> Episode | None: ...

    @abstractmethod
    async def live(self, now: float) -> int:
        """Episodes bound and not ended, across every worker and replica."""

    async def sweep(self, now: float) -> int:
        """Forget episodes idle for `idle_s`; how many. (Redis expires them by itself.)"""
        return 0

    @abstractmethod
    async def ping(self) -> None:
        """Raise `StoreUnavailableError` unless the store answers."""

    @abstractmethod
    async def close(self) -> None: ...


def open_store(url: str | None, path: Path | None, idle_s: float, max_episodes: int, max_calls: int):
    """The store `CASE_ENV_STORE` names (a redis:// or rediss:// URL), else SQLite in `path` (in memory
    when None: one process's episodes, for an app built in-process)."""
    if url:
        from case_env.server.store.redis import RedisStore

        return RedisStore(url, idle_s, max_episodes, max_calls)
    from case_env.server.store.sqlite import SQLiteStore

    return SQLiteStore(path, idle_s, max_episodes, max_calls)
