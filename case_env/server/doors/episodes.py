"""An episode a door runs on this server: a bank row (or a bare case), its calls and its reward.

Every door (OpenEnv, MCP) plays its calls through the tool route's own `answer`, so a call meets the same
readiness, admission, scope, argument checks, cache, audit line, metrics and episode log as a call over
`/v1/tools`, and is recorded as every client records it (`case_env.core.episode`). The reward is the row's,
computed by `case_env.reward` as verl's reward manager computes it, from the final answer and the calls.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

from pydantic import ValidationError

from case_env.core import episode as episodes
from case_env.core.bank import Item, load_items
from case_env.core.calls import FIELD, ExecutedCall
from case_env.core.client import Reply
from case_env.core.environment import Environment
from case_env.core.problems import describe_errors
from case_env.reward import compute_score
from case_env.server.models import ToolCallRequest
from case_env.server.routes.tools import answer_fields, settle
from case_env.server.state import ServerState


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


@dataclass
class DoorEpisode:
    """One episode: the case it is bound to, the row it started from (None for a bare case), its calls."""

    state: ServerState
    env: Environment
    case_id: str
    item: Item | None = None
    episode_id: str = field(default_factory=lambda: f"door-{uuid4().hex}")
    calls: list[ExecutedCall] = field(default_factory=list)
    create: dict[str, Any] = field(default_factory=dict)
    reward: dict[str, Any] | None = None

    @classmethod
    def start(
        cls,
        state: ServerState,
        env: Environment,
        item: Item | None,
        case_id: str | None,
        episode_id: str | None,
    ) -> DoorEpisode:
        """Bind a new episode to the row's case (or the named case), refusing what the HTTP API refuses."""
        create = (
            {**episodes.create_kwargs(item.extra), "patient_id": item.extra["patient_id"]} if item else {}
        )
        case_id = create.get("patient_id") or case_id
        if not case_id:
            raise DoorError("name a bank row (row, or split and index) or a case_id to start an episode")
        if state.environment(case_id) != env.name:
            raise DoorError(f"unknown {env.title} case {case_id!r}")
        episode = cls(state, env, case_id, item, create=create or {"patient_id": case_id})
        if episode_id:
            episode.episode_id = episode_id
        if state.episodes.bind(episode.episode_id, case_id) != case_id:
            raise DoorError("this episode is bound to another case; start one with a new episode id")
        return episode

    @property
    def tools(self) -> list[str]:
        return row_tools(self.env, self.item)

    @property
    def prompt(self) -> list[dict]:
        return [dict(m) for m in self.item.prompt] if self.item else []

    async def call(self, tool: str, arguments: dict) -> Reply:
        """One tool call through the tool route, recorded as it ran."""
        if self.reward is not None:
            raise DoorError("the episode has ended; start a new one")
        body = episodes.body(self.env, self.episode_id, self.create, arguments, self.calls)
        try:
            request = ToolCallRequest.model_validate(body)
        except ValidationError as exc:
            raise DoorError("invalid call: " + describe_errors(exc.errors(include_url=False), ())) from None
        started = time.monotonic()
        outcome, latency_ms = await settle(self.state, tool, request)
        # the tool API's answer as a dict, its images' base64 in place: no JSON written and read back
        payload = answer_fields(outcome, tool, self.episode_id, latency_ms)
        payload["error"] = payload["error"] and payload["error"].model_dump()
        payload["images"] = [
            {**image.model_dump(), "data_b64": data.decode()}
            for image, data in zip(outcome.images, outcome.encoded, strict=True)
        ]
        reply = Reply.answered(outcome.status, payload)
        self.calls.append(episodes.executed(self.env, tool, arguments, reply, started))
        return reply

    async def finish(self, text: str) -> dict[str, Any]:
        """The row's reward for the final answer `text` and the calls made (once; a bare case has none)."""
        if self.reward is not None:
            return self.reward
        if self.item is None:
            raise DoorError("a case started without a bank row has no reward; start from a row to be scored")
        extra = {**self.item.extra, FIELD: [c.record() for c in self.calls]}
        self.reward = await compute_score(self.item.data_source, text, self.item.ground_truth, extra)
        return self.reward
