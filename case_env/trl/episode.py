"""TRL's `environment_factory` over a case-env server: one class per tool set, whose public methods are the
row's tools.

TRL (1.16) builds one environment per rollout from the factory, calls `reset(**row)` with the dataset row,
offers the class's public methods as tools (their schemas read from signatures and docstrings by transformers'
`get_json_schema`) and runs the calls the model writes. Here each method is made from the tool's schema as the
server serves it, so the model is shown the same tools verl shows it; a call goes to the server within the
row's case, through the client, body and record every other client uses (`case_env.core.episode`). Rows offer
different tools (a persona's subset, a case's own work-up), so a bank gets one class per distinct tool set,
chosen by the row's `environment` column (TRL's several-environments mode).
"""

from __future__ import annotations

import inspect
import json
from typing import Any, ClassVar
from uuid import uuid4

from case_env.core import episode as episodes
from case_env.core.calls import Call
from case_env.core.client import LoopClients, RetryPolicy
from case_env.core.environment import Environment

TYPES = {"string": str, "integer": int, "number": float, "boolean": bool}
TEXT_ONLY = "(The image is not shown: this model reads text only.)"


class CaseEpisode:
    """One rollout's episode: its case, id and calls; a subclass adds the tools (`episode_class`)."""

    env: ClassVar[Environment]
    settings: ClassVar[RetryPolicy] = RetryPolicy()
    images: ClassVar[bool] = False  # a vision-language model gets a tool's images as image parts

    def __init__(self) -> None:
        self.episode_id = ""
        self.create: dict = {}
        self.calls: list[Call] = []
        self._clients = LoopClients(self.settings)

    def reset(self, **row: Any) -> None:
        """Bind the episode to the row's case (from the row, never from the model) under a new episode id."""
        extra = row.get("extra_info")
        extra = json.loads(extra) if isinstance(extra, str) else dict(extra or {})
        self.create = {**episodes.create_kwargs(extra), "patient_id": extra["patient_id"]}
        self.episode_id = f"trl-{uuid4().hex}"
        self.calls = []

    async def _call(self, tool: str, arguments: dict) -> str | list:
        if not self.create:
            return "Error: no case is bound to this episode."
        reply, call = await episodes.call(
            self._clients.get(), self.env, self.episode_id, self.create, tool, arguments
        )
        self.calls.append(call)
        text, pngs = reply.model_text(), reply.pngs()
        if not pngs:
            return text
        if not self.images:
            return f"{text}\n{TEXT_ONLY}" if text else TEXT_ONLY
        import io

        from PIL import Image

        parts: list = [{"type": "image", "image": Image.open(io.BytesIO(p)).convert("RGB")} for p in pngs]
        return [*parts, {"type": "text", "text": text}]


def method_for(schema: dict) -> Any:
    """An async method standing for the tool: its signature and docstring carry the schema's parameters
    (enums as `(choices: [...])`), so transformers renders the schema the server serves; it takes whatever
    arguments the model writes, so wrong ones get the server's model-fault text naming the valid values."""
    function = schema["function"]
    name, params = function["name"], function.get("parameters") or {}
    required = set(params.get("required") or ())
    properties = params.get("properties") or {}

    async def tool(self: CaseEpisode, **arguments: Any) -> str | list:
        return await self._call(name, arguments)

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    lines = []
    for key, prop in properties.items():
        kind = TYPES.get(prop.get("type"), str)
        default = inspect.Parameter.empty if key in required else None
        parameters.append(
            inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
        )
        described = " ".join(str(prop.get("description") or key).split())
        if prop.get("enum"):
            described += f" (choices: {json.dumps(prop['enum'])})"
        lines.append(f"    {key}: {described}")
    tool.__name__ = tool.__qualname__ = name
    tool.__signature__ = inspect.Signature(parameters)
    tool.__annotations__ = {p.name: p.annotation for p in parameters[1:]}
    summary = " ".join(str(function.get("description") or name).split())
    tool.__doc__ = summary + ("\n\nArgs:\n" + "\n".join(lines) if lines else "")
    return tool


def episode_class(
    env: Environment, tools: list[str], settings: RetryPolicy | None = None, images: bool = False
) -> type[CaseEpisode]:
    """A CaseEpisode whose methods are `tools` of `env`."""
    clash = [t for t in tools if t == "reset" or t == "get_reward" or not t.isidentifier()]
    if clash:
        raise ValueError(f"tools {clash} cannot be methods of a TRL environment")
    methods = {name: method_for(env.tools[name].openai_schema()) for name in tools}
    attributes = {"env": env, "settings": settings or RetryPolicy(), "images": images, **methods}
    return type(f"{env.name.title()}Episode", (CaseEpisode,), attributes)
