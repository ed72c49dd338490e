"""One episode's calls to a case-env server, made the same way by every client: verl's `CaseTool`, the eval
runner, TRL's environment.

A call's body names the episode and its case, the model's arguments and, for an environment with a context
model, the context built from the row's `create_kwargs` and the calls so far (the server keeps no conversation
state). How it ran is kept as an `ExecutedCall`, with the tool's answer when the tool is declared `remember`;
rewards read those records.
"""

from __future__ import annotations

import time
from typing import Any

from case_env.core.calls import ExecutedCall
from case_env.core.client import Reply, ToolClient
from case_env.core.environment import Environment


def create_kwargs(extra_info: dict) -> dict:
    """The row's `create_kwargs` (every tool of a row has the same): its case and the episode's settings."""
    tools_kwargs = extra_info.get("tools_kwargs") or {}
    first = next(iter(tools_kwargs.values()), {}) if isinstance(tools_kwargs, dict) else {}
    return dict((first or {}).get("create_kwargs") or {})


def body(
    env: Environment | None,
    episode_id: str,
    create: dict,
    arguments: dict,
    calls: list[ExecutedCall],
) -> dict[str, Any]:
    """What `POST /v1/tools/{name}` is sent: the case from the row, never from the model."""
    out: dict[str, Any] = {
        "episode_id": episode_id,
        "patient_id": create["patient_id"],
        "arguments": arguments,
    }
    if env is not None and env.context_model is not None:
        context = env.episode_context(create, calls)
        if context is not None:
            out["context"] = context
    return out


def executed(
    env: Environment | None, tool: str, arguments: dict, reply: Reply, started: float | None = None
) -> ExecutedCall:
    """The call as it ran; `started` is its `time.monotonic()` start, for its latency."""
    spec = env.tools.get(tool) if env is not None else None
    latency = round((time.monotonic() - started) * 1000, 1) if started is not None else 0.0
    text = reply.text if spec is not None and spec.remember else None
    return ExecutedCall(tool, dict(arguments), reply.status, reply.infra_error, reply.attempts, latency, text)


async def call(
    client: ToolClient,
    env: Environment | None,
    episode_id: str,
    create: dict,
    tool: str,
    arguments: dict,
    calls: list[ExecutedCall],
) -> tuple[Reply, ExecutedCall]:
    """One call of the episode: sent, answered, and recorded as it ran (not appended to `calls`)."""
    started = time.monotonic()
    reply = await client.call(tool, body(env, episode_id, create, arguments, calls))
    return reply, executed(env, tool, arguments, reply, started)
