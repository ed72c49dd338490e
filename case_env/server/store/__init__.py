"""Episode state, owned by the server: each episode's binding, its calls, its end, idle expiry and the cap.

A call names its episode and case and carries the row's settings (its `context`); the server keeps the rest.
A call looks its episode up (`lookup`: refused there when bound to another case or ended), runs, and is
appended to the episode's log in one atomic write before its answer leaves (`append`); the first call's
append binds a new episode to its case, its environment and those settings, the first writer winning
whichever worker or replica it reaches, and a call that lost that race is refused, its answer never sent.
A tool whose answer depends on the episode so far (a patient's conversation, an attempt budget) is given a
context the environment builds from the log. A door binds an episode when it starts it (`bind`) and ends it
with its reward (`end`): an ended episode is never reopened, and its reward is the first one.

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
        # bindings this worker has seen, for lookups that need no more: a binding never changes while its
        # episode lives, and `append` checks it in the store, so a stale one (an episode ended, or expired
        # and bound anew elsewhere) costs a refused record, never an answer sent for the wrong case
        self._known: OrderedDict[str, Binding] = OrderedDict()

    async def lookup(
        self, episode_id: str, with_calls: bool = False, wanted: Binding | None = None
    ) -> tuple[Binding | None, list[Call]]:
        """The episode's binding (None for a new or expired episode) and, when `with_calls`, its calls so far
        (oldest first, as many as `max_calls` keeps). A binding this worker saw answers when it is `wanted`
        (the call would go on); one that would refuse the call is asked of the store first."""
        if wanted is not None and not with_calls:
            known = self._known.get(episode_id)
            if known == wanted:
                self._known.move_to_end(episode_id)
                return known, []
        found, calls = await self._lookup(episode_id, with_calls)
        if found is not None:
            self._remember(episode_id, found)
        return found, calls

    async def bind(self, episode_id: str, binding: Binding, now: float) -> Binding:
        """Bind a new episode (a door's start); the binding it has, this one when it is new."""
        bound = await self._bind(episode_id, binding, now)
        self._remember(episode_id, bound)
        return bound

    async def append(self, episode_id: str, binding: Binding, call: Call, now: float) -> Binding:
        """Record a call of the episode, in one atomic write durable enough to outlive a killed worker,
        binding the episode to `binding` if it has none; returns the binding it has. The call was recorded
        when that is `binding`, not ended; otherwise nothing was (another case won, or it ended)."""
        bound = await self._append(episode_id, binding, call, now)
        self._remember(episode_id, bound)
        return bound

    async def end(self, episode_id: str, reward: dict[str, Any], now: float) -> dict[str, Any] | None:
        """End a live episode with its reward; returns the reward it keeps (the first one given), None for
        an unknown episode."""
        self._known.pop(episode_id, None)
        return await self._end(episode_id, reward, now)

    def _remember(self, episode_id: str, binding: Binding) -> None:
        self._known[episode_id] = binding
        self._known.move_to_end(episode_id)
        if len(self._known) > KNOWN:
            self._known.popitem(last=False)

    @abstractmethod
    async def _lookup(self, episode_id: str, with_calls: bool) -> tuple[Binding | None, list[Call]]: ...

    @abstractmethod
    async def _bind(self, episode_id: str, binding: Binding, now: float) -> Binding: ...

    @abstractmethod
    async def _append(self, episode_id: str, binding: Binding, call: Call, now: float) -> Binding: ...

    @abstractmethod
    async def _end(self, episode_id: str, reward: dict[str, Any], now: float) -> dict[str, Any] | None: ...

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
