"""The tool server verifiers starts for each rollout: the environment's tools as case-env's MCP door lists
them, each call forwarded to the door within the rollout's episode (started by the task's setup)."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import verifiers.v1 as vf
from mcp.server.mcpserver import MCPServer
from pydantic import Field, WithJsonSchema

from case_env_verifiers.door import DoorConfig, session

EPISODE = "episode_id"
DOOR_OWN = {"start_episode", "finish_episode"}  # the door's episode tools: the task's, not the model's


class CaseState(vf.State):
    episode_id: str | None = None
    """The door's episode this rollout plays (set by the task's setup, read by every tool call)."""


class CaseToolsConfig(vf.ToolsetConfig, DoorConfig):
    pass


class CaseToolset(vf.Toolset[CaseToolsConfig, CaseState]):
    TOOL_PREFIX = None  # the tools' own names, as the bank's prompts and verl's rollouts call them

    async def setup(self) -> None:
        async with session(self.config) as client:
            self.listed = [tool for tool in (await client.list_tools()).tools if tool.name not in DOOR_OWN]
        self.allowed: set[str] | None = None

    async def setup_task(self, task: Any) -> None:
        # verifiers hands over the task's data (a CaseData row); the row's persona's tools are what
        # verl's rollouts offer for it, so the model sees no tool its persona may not call
        self.allowed = set(getattr(task, "data", task).tools)

    def register(self, mcp: MCPServer) -> None:
        for tool in self.listed:
            if self.allowed is not None and tool.name not in self.allowed:
                continue
            mcp.add_tool(
                self._with_state(self._forward(tool.name, tool.input_schema)),
                name=tool.name,
                description=tool.description,
            )

    def _forward(self, name: str, schema: dict):
        """A function with the tool's parameters (the door's schemas, less the episode id) that calls it."""
        required = set(schema.get("required") or ())
        parameters = [
            inspect.Parameter(
                key,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if key in required else None,
                annotation=Annotated[Any, WithJsonSchema(spec), Field(description=spec.get("description"))],
            )
            for key, spec in (schema.get("properties") or {}).items()
            if key != EPISODE
        ]

        async def forward(**arguments: Any) -> Any:
            given = {key: value for key, value in arguments.items() if value is not None}
            async with session(self.config) as client:
                # the door's answer as it is: text that names a refusal's fix, images as MCP image content
                return await client.call_tool(name, {EPISODE: self.state.episode_id, **given})

        forward.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        forward.__name__ = name
        return forward


if __name__ == "__main__":
    CaseToolset.run()
