"""An episode a door runs on this server: a bank row (or a bare case), its calls and its reward.

Every door (OpenEnv, MCP) starts episodes with one request model (`Start`) and plays its calls through the
tool route's own `settle`, validated by the tool API's own `ToolCallRequest`: a call meets the same size
limits, readiness, admission, scope, argument checks, cache, audit line, metrics and episode log as a call
over `/v1/tools`, and is refused with the same words. The episode itself lives in the server's store: its
binding names the row it started from, its calls are the log, and its end keeps the first reward, so any
worker or replica can go on with it and no door can reopen it. The reward is the row's, computed by
`case_env.reward` as verl's reward manager computes it, from the final answer and the calls.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from case_env.core import episode as episodes
from case_env.core.bank import Item, load_items
from case_env.core.calls import FIELD
from case_env.core.client import Reply
from case_env.core.environment import Environment
from case_env.core.problems import describe_errors
from case_env.reward import compute_score
from case_env.server.models import CASE_ID_PATTERN, EPISODE_ID_PATTERN, ToolCallRequest
from case_env.server.routes.tools import response, settle
from case_env.server.state import ServerState
from case_env.server.store import Binding, StoreUnavailableError


class DoorError(ValueError):
    """A request a door refuses: the message names the problem and what to send instead."""


class Rows:
    """The rows of the served banks, by key (`test-00003`) and by environment and split."""

    def __init__(self, items: list[Item], hosted: dict[str, Environment]):
        self.hosted = hosted
        self.by_key: dict[str, Item] = {}
        self.splits: dict[str, dict[str, list[Item]]] = {name: {} for name in hosted}
        for item in items:
            env = item.extra.get("env")
            if env not in hosted:
                continue
            self.by_key[item.key] = item
            split = item.extra.get("split") or item.key.rsplit("-", 1)[0]
            self.splits[env].setdefault(split, []).append(item)

    @classmethod
    def load(cls, banks: list[Path], hosted: dict[str, Environment]) -> Rows:
        return cls([item for bank in banks for item in load_items(Path(bank))], hosted)

    def split(self, env: str, split: str | None) -> tuple[str, list[Item]]:
        """A split's name and rows (default test, else the first split served)."""
        splits = self.splits.get(env) or {}
        if not splits:
            raise DoorError(f"no {env} bank is served; start the server with --bank BANK")
        split = split or ("test" if "test" in splits else next(iter(splits)))
        chosen = splits.get(split)
        if chosen is None:
            raise DoorError(f"unknown split {split!r}; the served {env} banks have {', '.join(splits)}")
        return split, chosen

    def pick(self, env: str, row: str | None, split: str | None, index: int | None, seed: int | None) -> Item:
        """A row by key, by split and index, or drawn from a split (seeded when `seed` is given)."""
        if row is not None:
            item = self.by_key.get(row)
            if item is None or item.extra.get("env") != env:
                raise DoorError(
                    f"no {env} row {row!r} in the served banks; ask for a split and index instead"
                )
            return item
        split, chosen = self.split(env, split)
        if index is None:
            return random.Random(seed).choice(chosen) if seed is not None else random.choice(chosen)
        if not 0 <= index < len(chosen):
            raise DoorError(f"index {index} is outside split {split!r} (0 to {len(chosen) - 1})")
        return chosen[index]


def row_tools(env: Environment, item: Item | None) -> list[str]:
    """A row's tools (its persona's selection), or every tool of the environment for a bare case."""
    chosen = item.extra.get("tool_selection") if item else None
    return [t for t in chosen if t in env.tools] if chosen else list(env.tools)


class Start(BaseModel):
    """How a door starts an episode (OpenEnv's reset, MCP's start_episode): a bank row by key, by split and
    index, or drawn (seeded when `seed` is given), or a bare case; and optionally the episode's own id."""

    model_config = ConfigDict(extra="forbid", strict=True)

    row: str | None = Field(None, max_length=128, description="A bank row's key (e.g. test-00003).")
    split: str | None = Field(None, max_length=64, description="A split of the served bank (default test).")
    index: int | None = Field(None, ge=0, description="The row's position in the split.")
    seed: int | None = Field(None, description="Draws the row, when neither row nor index names one.")
    case_id: str | None = Field(
        None, pattern=CASE_ID_PATTERN, description="A case, without a row (no reward at the end)."
    )
    episode_id: str | None = Field(
        None,
        pattern=EPISODE_ID_PATTERN,
        description="An id of your own for the episode (default: a new one).",
    )

    @classmethod
    def of(cls, fields: dict[str, Any]) -> Start:
        """The start a door's client asked for, or a DoorError naming each field that is wrong."""
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise DoorError("invalid start: " + describe_errors(exc.errors(include_url=False), ())) from None


@dataclass
class DoorEpisode:
    """One episode of a door: the case it is bound to and the row it started from (None for a bare case)."""

    state: ServerState
    env: Environment
    case_id: str
    episode_id: str
    item: Item | None = None

    @classmethod
    async def start(cls, state: ServerState, env: Environment, rows: Rows, start: Start) -> DoorEpisode:
        """Bind a new episode to the row's case (or the named case), refusing what the HTTP API refuses; an
        ended episode's id is refused by name."""
        item = None
        if start.case_id is None:
            item = rows.pick(env.name, start.row, start.split, start.index, start.seed)
        case_id = item.extra["patient_id"] if item is not None else start.case_id
        if state.environment(case_id) != env.name:
            raise DoorError(f"unknown {env.title} case {case_id!r}")
        episode = cls(state, env, case_id, start.episode_id or f"door-{uuid4().hex}", item)
        context = episodes.settings(env, episode.create)
        settings = (
            env.context_model.model_validate(context).model_dump_json() if context is not None else None
        )
        binding = Binding(case_id, env.name, settings, item.key if item is not None else None)
        bound = await _store(state.store.bind(episode.episode_id, binding, time.time()))
        if bound.ended:
            raise DoorError(f"episode {episode.episode_id} has ended; start a new one with a new episode id")
        if bound != binding:
            raise DoorError("this episode is bound to another case or row; start one with a new episode id")
        return episode

    @classmethod
    async def find(
        cls, state: ServerState, env: Environment, rows: Rows, episode_id: Any, start: str
    ) -> DoorEpisode:
        """An episode a door started, by its id, from the store (whichever worker started it); `start` names
        how the door's client starts one."""
        known = (await _store(state.store.lookup(episode_id)))[0] if isinstance(episode_id, str) else None
        if known is None or known.env != env.name:
            raise DoorError(
                f"unknown episode_id {episode_id!r}: call {start} and pass the episode_id it returns"
            )
        if known.ended:
            raise DoorError(f"episode {episode_id} has ended; start a new one with a new episode id")
        item = rows.by_key.get(known.row) if known.row else None
        return cls(state, env, known.case_id, episode_id, item)

    @property
    def create(self) -> dict[str, Any]:
        """The row's create_kwargs, its case included (a bare case has only the case)."""
        if self.item is None:
            return {"patient_id": self.case_id}
        return {**episodes.create_kwargs(self.item.extra), "patient_id": self.case_id}

    @property
    def tools(self) -> list[str]:
        return row_tools(self.env, self.item)

    @property
    def prompt(self) -> list[dict]:
        return [dict(m) for m in self.item.prompt] if self.item else []

    async def call(self, tool: str, arguments: Any) -> Reply:
        """One tool call through the tool route, validated as the tool API validates it."""
        try:
            request = ToolCallRequest.model_validate(
                episodes.body(self.env, self.episode_id, self.create, arguments)
            )
        except ValidationError as exc:
            raise DoorError("invalid call: " + describe_errors(exc.errors(include_url=False), ())) from None
        outcome, latency_ms = await settle(self.state, tool, request)
        payload = response(outcome, tool, self.episode_id, latency_ms).model_dump()
        return Reply.answered(outcome.status, payload)

    async def finish(self, text: str) -> dict[str, Any]:
        """The row's reward for the final answer `text` and the calls the server logged; the episode ends
        with it, once: a second answer gets the first reward back."""
        if self.item is None:
            raise DoorError("a case started without a bank row has no reward; start from a row to be scored")
        known = await _store(self.state.store.get(self.episode_id))
        if known is None:
            raise DoorError(f"episode {self.episode_id} expired; start a new one")
        if known.reward is not None:
            return known.reward
        extra = {**self.item.extra, FIELD: [c.record() for c in known.calls]}
        reward = await compute_score(self.item.data_source, text, self.item.ground_truth, extra)
        kept = await _store(self.state.store.end(self.episode_id, reward, time.time()))
        if kept is None:
            raise DoorError(f"episode {self.episode_id} expired; start a new one")
        return kept


async def _store(pending):
    """A store operation; an unreachable store as a DoorError the client can act on (retry)."""
    try:
        return await pending
    except StoreUnavailableError:
        raise DoorError("the episode store is unreachable; retry shortly") from None
