"""The OpenEnv door: each hosted environment under `/openenv/<env>`, served by OpenEnv's own `HTTPEnvServer`
(the `openenv` extra), so OpenEnv's `EnvClient`, TRL's OpenEnv path and OpenEnv's tooling speak to it as to
any OpenEnv environment.

`reset` binds an episode to a bank row (`row`, or `split` and `index`, or a draw seeded by `seed`) and
observes its prompt and tools; `step` takes one tool call or the final answer; the answer's step is `done`,
its `reward` the row's. A WebSocket (`/ws`) holds one episode per connection, many at once; each call goes
through the tool route (`doors.episodes`). Each frame is checked before OpenEnv's handler reads it
(`FrameGuard`): one that is not a JSON object, or is binary, or too large or too deeply nested, is answered
with OpenEnv's own error message and the session goes on, as a bad request over HTTP leaves the server as it
was. Sessions created over OpenEnv's HTTP MCP endpoint without a WebSocket expire after
`CASE_ENV_DOOR_SESSION_IDLE_S` without a message; those a WebSocket holds live as long as it does.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironment
from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, State
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from case_env.core.environment import Environment
from case_env.server.doors.episodes import DoorEpisode, DoorError, Start
from case_env.server.settings import ServerSettings


class CaseAction(Action):
    """One tool call (`tool` and `arguments`) or the final answer (`answer`, the model's last message)."""

    tool: str | None = Field(None, max_length=64, description="A tool of the row, as listed at reset.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments.")
    answer: str | None = Field(None, max_length=200_000, description="The final message; ends the episode.")

    @model_validator(mode="after")
    def _one(self) -> CaseAction:
        if (self.tool is None) == (self.answer is None):
            # a custom error: OpenEnv sends a validation error's details to the client as JSON, which a
            # ValueError in them cannot be written as (it ended the session)
            raise PydanticCustomError(
                "tool_or_answer", "send either tool (with arguments) or answer, not both and not neither"
            )
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
        self.calls = 0  # of the episode, through this session
        self.reward: dict[str, Any] | None = None

    async def reset_async(self, **fields: Any) -> CaseObservation:
        state = self.app.state.server
        start = Start.of({k: v for k, v in fields.items() if v is not None})
        self.episode = episode = await DoorEpisode.start(state, self.env, self.app.state.door_rows, start)
        self.calls, self.reward = 0, None
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
            self.reward = reward = await episode.finish(action.answer)
            return CaseObservation(**base, done=True, reward=float(reward["score"]), metadata=reward)
        if self.reward is not None:
            raise DoorError(f"episode {episode.episode_id} has ended; reset to start a new one")
        reply = await episode.call(action.tool or "", action.arguments)
        self.calls += 1
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
            step_count=self.calls + (self.reward is not None),
            case_id=episode.case_id,
            row=episode.item.key if episode.item else None,
            calls=self.calls,
            ended=self.reward is not None,
        )


def _task_route(path: str) -> bool:
    return path == "/list_environments" or path.startswith("/{env_name}/")


def _error(message: str, code: str) -> str:
    """An error frame as OpenEnv's own server writes one (`WSErrorResponse`)."""
    return json.dumps({"type": "error", "data": {"message": message, "code": code}})


def _frame_problem(message: Message, max_bytes: int) -> str | None:
    """Why a WebSocket frame cannot be handed to OpenEnv's handler (which would end the session), or None."""
    text = message.get("text")
    if text is None:
        return "binary frames are not read: send each message as JSON text"
    if len(text) > max_bytes:  # before parsing: a large frame costs the event loop nothing more
        return f"message too large: at most {max_bytes} bytes are read"
    try:
        document = json.loads(text)
    except RecursionError:
        return "message nested too deeply"
    except ValueError as exc:
        return f"Invalid JSON: {exc}"
    if not isinstance(document, dict):
        return "a message is a JSON object with a type (reset, step, state, close)"
    return None


class FrameGuard:
    """Checks each frame a client sends on the door's WebSocket before OpenEnv's handler reads it: a frame
    it would end the session over gets OpenEnv's own error message instead, and the session goes on. HTTP
    requests pass untouched (the tool API's limits apply to them already)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def checked() -> Message:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                problem = _frame_problem(message, self.max_bytes)
                if problem is None:
                    return message
                await send({"type": "websocket.send", "text": _error(problem, "INVALID_JSON")})

        await self.app(scope, checked, send)


def install(app: FastAPI, hosted: dict[str, Environment], settings: ServerSettings) -> list[FastAPI]:
    """Mount each environment's OpenEnv server at /openenv/<env>. Returns the mounted apps, whose start-up
    and shutdown handlers (OpenEnv's reaper of idle sessions) the server's lifespan runs."""
    mounted = []
    # OpenEnv's reaper passes over sessions a WebSocket holds (uvicorn's pings close a dead one), so its
    # timeout is that of sessions created over HTTP alone: seconds, not the episode's idle time
    concurrency = ConcurrencyConfig(
        max_concurrent_envs=settings.max_in_flight * 4, session_timeout=settings.door_session_idle_s
    )
    for name, env in hosted.items():
        sub = FastAPI(title=f"case-env {name} (OpenEnv)")
        server = HTTPEnvServer(
            lambda env=env: CaseEnvironment(app, env),
            CaseAction,
            CaseObservation,
            concurrency_config=concurrency,
            env_name=name,
            state_cls=CaseState,
        )
        server.register_routes(sub, mode="production")  # no stateless /reset, /step: episodes live on /ws
        # its Task API answers 501 for an environment without one: the served rows are `GET /v1/rows/<env>`,
        # and `reset` takes a split and index
        sub.router.routes = [r for r in sub.router.routes if not _task_route(getattr(r, "path", ""))]
        app.mount(f"/openenv/{name}", FrameGuard(sub, settings.max_score_body_bytes))
        mounted.append(sub)
    return mounted
