"""Drive an Agent against a case-env server over plain HTTP (no verl), one call at a time."""

from __future__ import annotations

import base64
import io

import httpx
from PIL import Image

from case_env.agents.base import Agent, Decision, ToolOutput


def run_episode(client: httpx.Client, agent: Agent, patient_id: str, episode_id: str, max_calls: int = 32
                ) -> tuple[Decision, list[ToolOutput]]:  # fmt: skip
    outputs: list[ToolOutput] = []
    while len(outputs) < max_calls and (move := agent.next_call(outputs)) is not None:
        tool, arguments = move
        reply = client.post(f"/v1/tools/{tool}", json={"episode_id": episode_id, "patient_id": patient_id,
                                                         "arguments": arguments})  # fmt: skip
        body = reply.json()
        image = png = None
        if body.get("images"):
            png = base64.b64decode(body["images"][0]["data_b64"])
            image = Image.open(io.BytesIO(png)).convert("RGB")
        text = body.get("text") or body.get("error", {}).get("message", "")
        outputs.append(
            ToolOutput(tool, arguments, text if body.get("ok", False) else f"Error: {text}", image, png)
        )
    return agent.decide(outputs), outputs
