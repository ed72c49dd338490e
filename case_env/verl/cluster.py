"""The case-env server as verl's rollout workers will reach it: from a Ray task on every node of the cluster.

verl builds its tools inside AgentLoopWorker actors that Ray spreads over every node, and each one resolves
the tool YAML's `${oc.env:CASE_ENV_URL,...}` and reads `CASE_ENV_TOKEN` in its own process. verl forwards a
fixed list of environment variables to its workers (`trainer/constants_ppo.py`), so the launcher passes the
server's URL and token through the job's runtime environment (`ray_kwargs.ray_init.runtime_env.env_vars`,
which `main_ppo` hands to `ray.init`; docs/sources.md, verl 0.9.1). This module joins the same cluster with
the same runtime environment and runs, pinned to each node, what a rollout worker will do: load the tool
YAML with verl's loader, build `CaseTool`, call one tool of the bank for one of its cases. It also checks
that the files the job names (banks, tool YAML, reward, dataset class) exist on that node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class NodeReport:
    """What one node saw."""

    node_id: str
    address: str
    gpus: float
    local: bool  # the node this process runs on
    url: str | None = None
    token: bool = False
    missing: list[str] = field(default_factory=list)
    health: str = ""  # "200", or why /healthz did not answer
    call: str = ""  # the call's status: ok, a model-fault code, or an infrastructure status
    infra_error: bool = True
    text: str = ""
    latency_ms: float = 0.0

    @property
    def reached(self) -> bool:
        """/healthz answered and the tool call was answered by the server (a model fault counts)."""
        return self.health == "200" and bool(self.call) and not self.infra_error


def _probe(paths: list[str], tool_yaml: str, tool: str, create_kwargs: dict, arguments: dict) -> dict:
    """Runs on a node, as a rollout worker runs: URL and token from the job's environment, tools from the
    YAML through verl's loader."""
    import asyncio
    import contextlib
    import io
    import types
    from uuid import uuid4

    import httpx
    from verl.tools.tool_registry import load_all_tools

    out: dict[str, Any] = {
        "url": os.environ.get("CASE_ENV_URL"),
        "token": bool(os.environ.get("CASE_ENV_TOKEN") or os.environ.get("CASE_ENV_TOKEN_FILE")),
        "missing": [p for p in paths if not Path(p).exists()],
    }
    if tool_yaml in out["missing"]:
        return out
    with contextlib.redirect_stdout(io.StringIO()):
        tools = {t.name: t for t in load_all_tools(tool_config_path=tool_yaml, function_tool_path=None)}
    adapter = tools[tool]
    # a probe must not wait out a worker's retry budget against a server it cannot reach
    adapter.settings = adapter.settings.model_copy(
        update={"retries": 1, "deadline_s": 10.0, "timeout_s": 5.0}
    )
    try:
        out["health"] = str(httpx.get(f"{adapter.settings.base_url}/healthz", timeout=5).status_code)
    except httpx.HTTPError as exc:
        out["health"] = type(exc).__name__

    async def call() -> tuple[str, dict]:
        agent = types.SimpleNamespace(request_id=f"preflight-{uuid4().hex}", extra_fields={})
        instance, _ = await adapter.create(create_kwargs=create_kwargs)
        try:
            response, _, _ = await adapter.execute(instance, arguments, agent_data=agent)
        finally:
            await adapter.release(instance)
        return response.text or "", agent.extra_fields["case_env_tool_calls"][-1]

    text, record = asyncio.run(call())
    out.update(
        call=record["status"],
        infra_error=record["infra_error"],
        text=text[:160],
        latency_ms=record["latency_ms"],
    )
    return out


def probe_nodes(
    address: str | None,
    env_vars: dict[str, str],
    paths: list[str],
    tool_yaml: str,
    tool: str,
    create_kwargs: dict,
    arguments: dict,
) -> list[NodeReport]:
    """Join the cluster verl will use (`address`, else RAY_ADDRESS, else a local Ray, as `ray.init()`
    decides) with the job's `env_vars`, and probe every live node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started = not ray.is_initialized()
    if started:
        ray.init(
            address=address,
            runtime_env={"env_vars": env_vars},
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
        )
    try:
        here = ray.get_runtime_context().get_node_id()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        task = ray.remote(num_cpus=0)(_probe)
        pending = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                paths, tool_yaml, tool, create_kwargs, arguments
            )
            for n in nodes
        ]
        reports = []
        for node, seen in zip(nodes, ray.get(pending, timeout=300), strict=True):
            report = NodeReport(
                node["NodeID"],
                node.get("NodeManagerAddress", "?"),
                float(node.get("Resources", {}).get("GPU", 0)),
                node["NodeID"] == here,
            )
            for key, value in seen.items():
                setattr(report, key, value)
            reports.append(report)
        return reports
    finally:
        if started:
            ray.shutdown()
