"""The OpenEnv baseline of `case-env bench server --baseline openenv`: the same imaging tools served through
OpenEnv's own app factory (openenv 0.10.0, `openenv.core.env_server.http_server.create_app`, the
optional extra `openenv`), as an OpenEnv environment would serve them.

The action names the tool, patient, episode and arguments; `step` runs the case-env tool on the same data
engine (store and imaging service, opened once per worker, since OpenEnv builds an `Environment` per
request and closes it after) and returns its text and images as the observation. OpenEnv validates the
action, runs `step` in its thread pool and serializes the observation: that is what this baseline measures.

    uvicorn case_env.envs.imaging.bench.openenv_engine:create_app --factory
"""

from __future__ import annotations

import base64
from functools import cache
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app as openenv_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from case_env.core import registry
from case_env.core.tools import ToolError
from case_env.envs.imaging.data.errors import DataError
from case_env.envs.imaging.settings import ImagingSettings


class ToolAction(Action):
    tool: str
    patient_id: str
    episode_id: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolObservation(Observation):
    ok: bool = True
    text: str = ""
    images: list[dict[str, Any]] = Field(default_factory=list)
    error: dict[str, str] | None = None


@cache
def _engine():
    env = registry.get("imaging")
    return env, env.open_cases(ImagingSettings())


class CaseToolEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ToolObservation:
        return ToolObservation(text="ready")

    def step(self, action: ToolAction, timeout_s: float | None = None, **kwargs: Any) -> ToolObservation:
        env, store = _engine()
        spec = env.tools.get(action.tool)
        if spec is None:
            return _failure("unknown_tool", f"unknown tool {action.tool!r}")
        try:
            args = spec.parse(action.arguments)
            result = spec.run(env.tool_context(store, action.patient_id, None), args)
        except ToolError as exc:
            return _failure(str(exc.code), exc.message)
        except (DataError, LookupError) as exc:
            return _failure("not_available", str(exc))
        images = [
            {
                "mime": i.mime,
                "width": i.width,
                "height": i.height,
                "data_b64": base64.b64encode(i.png).decode(),
            }
            for i in result.images
        ]
        return ToolObservation(text=result.text, images=images)

    @property
    def state(self) -> State:
        return State()


def _failure(code: str, message: str) -> ToolObservation:
    return ToolObservation(ok=False, text=message, error={"code": code, "message": message})


def create_app() -> FastAPI:
    _engine()  # open the store before serving, as case-env's lifespan does
    app = openenv_app(CaseToolEnvironment, ToolAction, ToolObservation, env_name="case_env_imaging")

    @app.get("/readyz")
    async def ready() -> dict:
        return {"ready": True}

    return app
