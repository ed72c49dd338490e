"""CaseTool: the verl `BaseTool` that calls a case-env server over HTTP, one class for every tool of every
environment, shaped by what verl 0.9.1 does (docs/architecture.md, "verl's limits"):

- The case comes from the row's `create_kwargs.patient_id`, never from the model; the episode id is
  `agent_data.request_id`, except under `rollout.full_determinism`, where verl names every trajectory
  `det-0`: such an id gets a suffix drawn once per trajectory, kept in `agent_data.extra_fields`.
- One tool object serves every trajectory of a worker: construction does no I/O, and the HTTP client is
  made inside whichever loop runs `execute`. Timeouts and retries are the shared client's (`core.client`).
- verl drops `execute`'s metrics, so every call is also appended to `extra_fields["case_env_tool_calls"]`,
  which reaches the reward's `extra_info`: rewards count the calls that really ran.
- For a model without a processor (`CASE_ENV_TOOL_IMAGES=false`), images stay out of the answer, which says
  so. A call carries the row's settings for its episode (`create_kwargs`); the server keeps the episode's
  calls and builds what a tool needs of them, so nothing of the trajectory is sent back.
"""

from __future__ import annotations

import functools
import io
import re
from typing import Any
from uuid import uuid4

from PIL import Image
from pydantic import TypeAdapter
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from case_env.core import episode as episodes
from case_env.core import registry
from case_env.core.calls import FIELD, Call
from case_env.core.client import LoopClients, Reply, RetryPolicy
from case_env.core.environment import Environment

EPISODE_FIELD = "case_env_episode_id"
_SHARED_IDS = re.compile(r"det-\d+")  # verl's request ids under full_determinism, shared by trajectories


def episode_id(agent_data: Any, instance_id: str) -> str:
    """The trajectory's episode id: verl's request id when it names one trajectory, else that id with a
    suffix drawn on the trajectory's first call and kept with it."""
    request_id = str(getattr(agent_data, "request_id", None) or instance_id)
    if agent_data is None or not _SHARED_IDS.fullmatch(request_id):
        return request_id
    return agent_data.extra_fields.setdefault(EPISODE_FIELD, f"{request_id}-{uuid4().hex}")


class CaseTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self.settings = RetryPolicy.model_validate(config)
        self.images = TypeAdapter(bool).validate_python(config.get("images", True))
        self._rows: dict[str, dict] = {}
        self._clients = LoopClients(self.settings)

    @functools.cached_property
    def environment(self) -> Environment | None:
        """The tool's environment, resolved once per tool object (every call of this tool has the same)."""
        return registry.for_tool(self.name)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._rows[instance_id] = dict(kwargs.get("create_kwargs") or {})
        return instance_id, ToolResponse()

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._rows.pop(instance_id, None)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        agent_data = kwargs.get("agent_data")
        episode = episode_id(agent_data, instance_id)
        row = self._rows.get(instance_id) or {}
        calls = agent_data.extra_fields.setdefault(FIELD, []) if agent_data is not None else []
        env = self.environment
        if not row.get("patient_id"):
            call = Call(tool=self.name, arguments=dict(parameters), status="no_patient", infra_error=True)
            response = ToolResponse(text="Error: no case is bound to this trajectory.")
        else:
            reply, call = await episodes.call(self._clients.get(), env, episode, row, self.name, parameters)
            response = _tool_response(reply, self.images)
        calls.append(call.record())
        metrics = {k: v for k, v in call.record().items() if k not in ("arguments", "text")}
        return response, 0.0, metrics


TEXT_ONLY = "(The image is not shown: this model reads text only.)"


def _tool_response(reply: Reply, images: bool = True) -> ToolResponse:
    pngs = reply.pngs()
    text = reply.model_text()
    if pngs and not images:
        return ToolResponse(text=f"{text}\n{TEXT_ONLY}" if text else TEXT_ONLY)
    pictures = [Image.open(io.BytesIO(png)).convert("RGB") for png in pngs]
    return (
        ToolResponse(text=text, image=pictures) if pictures else ToolResponse(text=text)
    )  # verl rejects image=None
