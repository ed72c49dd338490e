"""One episode's calls to a case-env server, made the same way by every client: verl's `CaseTool`, the eval
runner, TRL's environment.

A call's body names the episode and its case, the model's arguments and, for an environment with a context
model, the row's settings for its episodes (from the row's `create_kwargs`, never from the model). The
server keeps the episode's calls and builds what a tool needs of them itself; the client sends the call,
not its history. How the call ran is kept as a `Call`, with the tool's answer when the tool is declared
`remember`; rewards read those records.
"""

from __future__ import annotations

import time
from typing import Any

from case_env.core.calls import Call
from case_env.core.client import Reply, ToolClient
from case_env.core.environment import Environment


def create_kwargs(extra_info: dict) -> dict:
    """The row's `create_kwargs` (every tool of a row has the same): its case and the episode's settings."""
    tools_kwargs = extra_info.get("tools_kwargs") or {}
    first = next(iter(tools_kwargs.values()), {}) if isinstance(tools_kwargs, dict) else {}
    return dict((first or {}).get("create_kwargs") or {})


def settings(env: Environment | None, create: dict) -> dict | None:
    """The row's settings for its episodes, as the environment's context model names them; None for an
    environment that takes none."""
    if env is None or env.context_model is None:
        return None
    return {name: create[name] for name in env.context_model.model_fields if name in create}


def body(env: Environment | None, episode_id: str, create: dict, arguments: dict) -> dict[str, Any]:
    """What `POST /v1/tools/{name}` is sent: the case from the row, never from the model."""
    out: dict[str, Any] = {
        "episode_id": episode_id,
        "patient_id": create["patient_id"],
        "arguments": arguments,
    }
    context = settings(env, create)
    if context is not None:
        out["context"] = context
    return out


def executed(
    env: Environment | None, tool: str, arguments: dict, reply: Reply, started: float | None = None
) -> Call:
    """The call as it ran; `started` is its `time.monotonic()` start, for its latency."""
    spec = env.tools.get(tool) if env is not None else None
    latency = round((time.monotonic() - started) * 1000, 1) if started is not None else 0.0
    text = reply.text if spec is not None and spec.remember else None
    return Call(
        tool=tool,
        arguments=dict(arguments),
        status=reply.status,
        http_status=reply.http_status,
        latency_ms=latency,
        text=text,
        infra_error=reply.infra_error,
        attempts=reply.attempts,
    )


async def call(
    client: ToolClient, env: Environment | None, episode_id: str, create: dict, tool: str, arguments: dict
) -> tuple[Reply, Call]:
    """One call of the episode: sent, answered, and recorded as it ran."""
    started = time.monotonic()
    reply = await client.call(tool, body(env, episode_id, create, arguments))
    return reply, executed(env, tool, arguments, reply, started)
