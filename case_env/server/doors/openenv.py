"""The OpenEnv door: each hosted environment under `/openenv/<env>`, served by OpenEnv's own `HTTPEnvServer`
(the `openenv` extra), so OpenEnv's `EnvClient`, TRL's OpenEnv path and OpenEnv's tooling speak to it as to
any OpenEnv environment.

`reset` binds an episode to a bank row (`row`, or `split` and `index`, or a draw seeded by `seed`) and
observes its prompt and tools; `step` takes one tool call or the final answer; the answer's step is `done`,
its `reward` the row's. A WebSocket (`/ws`) holds one episode per connection, many at once; each call goes
through the tool route (`doors.episodes`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironment
from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, State
from pydantic import Field, model_validator

from case_env.core.environment import Environment
from case_env.server.doors.episodes import DoorEpisode, DoorError


class CaseAction(Action):
    """One tool call (`tool` and `arguments`) or the final answer (`answer`, the model's last message)."""

    tool: str | None = Field(None, max_length=64, description="A tool of the row, as listed at reset.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments.")
    answer: str | None = Field(None, max_length=200_000, description="The final message; ends the episode.")

    @model_validator(mode="after")
    def _one(self) -> CaseAction:
        if (self.tool is None) == (self.answer is None):
            raise ValueError("send either tool (with arguments) or answer, not both and not neither")
        return self


class CaseObservation(Observation):
    """At reset the row's prompt and tools; after a call its text and images; after the answer the reward."""

    episode_id: str = ""
    case_id: str = ""
    prompt: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list, description="OpenAI function schemas.")
    ok: bool = True
    text: str = Field("", description="What the model reads: the answer, or an error it can act on.")
    images: list[dict[str, Any]] = Field(default_factory=list, description="mime, width, height, data_b64.")
    error: str | None = Field(None, description="The refusal's code (unknown_tool, invalid_arguments...).")


class CaseState(State):
    case_id: str = ""
    row: str | None = None
    calls: int = 0
    ended: bool = False


class CaseEnvironment(OpenEnvEnvironment[CaseAction, CaseObservation, CaseState]):
    """One session's episodes of one hosted environment."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, app: FastAPI, env: Environment):
        super().__init__()
        self.app, self.env = app, env
        self.episode: DoorEpisode | None = None

    async def reset_async(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        row: str | None = None,
        split: str | None = None,
        index: int | None = None,
        case_id: str | None = None,
        **_: Any,
    ) -> CaseObservation:
        state = self.app.state.server
        item = None
        if case_id is None:
            item = self.app.state.door_rows.pick(self.env.name, row, split, index, seed)
        self.episode = episode = DoorEpisode.start(state, self.env, item, case_id, episode_id)
        tools = [state.tools[t].openai_schema() for t in episode.tools]
        return CaseObservation(
            episode_id=episode.episode_id, case_id=episode.case_id, prompt=episode.prompt, tools=tools
        )

    async def step_async(
        self, action: CaseAction, timeout_s: float | None = None, **_: Any
    ) -> CaseObservation:
        episode = self.episode
        if episode is None:
            raise DoorError("no episode: reset first")
        base = {"episode_id": episode.episode_id, "case_id": episode.case_id}
        if action.answer is not None:
            reward = await episode.finish(action.answer)
            return CaseObservation(**base, done=True, reward=float(reward["score"]), metadata=reward)
        reply = await episode.call(action.tool or "", action.arguments)
        images = [dict(image) for image in reply.payload.get("images") or []]
        error = None if reply.ok else reply.status
        return CaseObservation(**base, ok=reply.ok, text=reply.model_text(), images=images, error=error)

    def reset(self, *args: Any, **kwargs: Any) -> CaseObservation:
        raise DoorError("case-env's OpenEnv door keeps episodes over its WebSocket session (/ws)")

    def step(self, *args: Any, **kwargs: Any) -> CaseObservation:
        raise DoorError("case-env's OpenEnv door keeps episodes over its WebSocket session (/ws)")

    @property
    def state(self) -> CaseState:
        episode = self.episode
        if episode is None:
            return CaseState()
        return CaseState(
            episode_id=episode.episode_id,
            step_count=len(episode.calls) + (episode.reward is not None),
            case_id=episode.case_id,
            row=episode.item.key if episode.item else None,
            calls=len(episode.calls),
            ended=episode.reward is not None,
        )


def install(app: FastAPI, hosted: dict[str, Environment], max_sessions: int, idle_s: float) -> list[FastAPI]:
    """Mount each environment's OpenEnv server at /openenv/<env>. Returns the mounted apps, whose start-up
    and shutdown handlers (OpenEnv's reaper of idle sessions) the server's lifespan runs."""
    mounted = []
    for name, env in hosted.items():
        sub = FastAPI(title=f"case-env {name} (OpenEnv)")
        server = HTTPEnvServer(
            lambda env=env: CaseEnvironment(app, env),
            CaseAction,
            CaseObservation,
            # idle sessions are reaped: a half-open socket must not hold a slot for ever (OpenEnv PR #1000)
            concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_s),
            env_name=name,
            state_cls=CaseState,
        )
        server.register_routes(sub, mode="production")  # no stateless /reset, /step: episodes live on /ws
        app.mount(f"/openenv/{name}", sub)
        mounted.append(sub)
    return mounted
