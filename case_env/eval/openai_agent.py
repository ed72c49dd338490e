"""A real model behind any OpenAI-compatible chat server (vLLM, SGLang, a hosted API), as the policy of any
environment's rows.

The conversation starts from the row's prompt; the model sees only the row's tool subset (none, for a
single-turn row). Tool text goes back as a `tool` message. Images go back as a user message with an image
part right after it, because the chat format allows text only in tool messages and vLLM and the hosted APIs
follow it. A tool call whose arguments are not valid JSON gets an error reply and the model may try again;
the server is not called. The episode ends at the first reply without a tool call, or when the turn budget
(every completion requested, retries included) runs out.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from case_env.core.policy import Observation, Turn


@dataclass(frozen=True)
class ModelSettings:
    base_url: str
    model: str
    api_key: str = "EMPTY"
    max_turns: int | None = None  # None: the environment's turn budget
    timeout_s: float = 120.0
    temperature: float = 0.0
    max_tokens: int = 2048


class OpenAIPolicy:
    def __init__(
        self, prompt: list[dict], tools: list[dict], settings: ModelSettings, client, max_turns: int
    ):
        self.settings = settings
        self.client = client
        self.tools = tools
        self.max_turns = max_turns
        self.messages: list[dict] = [dict(m) for m in prompt]
        self.turns = 0
        self.malformed = 0
        self._pending: str | None = None  # id of the call whose output has not been sent back yet

    def next_turn(self, observations: list[Observation]) -> Turn:
        if self._pending is not None and observations:
            self._send_back(self._pending, observations[-1])
            self._pending = None
        while self.turns < self.max_turns:
            self.turns += 1
            reply = (
                self.client.chat.completions.create(
                    model=self.settings.model,
                    messages=self.messages,
                    tools=self.tools or None,
                    temperature=self.settings.temperature,
                    max_tokens=self.settings.max_tokens,
                    timeout=self.settings.timeout_s,
                )
                .choices[0]
                .message
            )
            calls = reply.tool_calls or []
            content = reply.content or ""
            self.messages.append(
                {
                    "role": "assistant",
                    "content": content,
                    **({"tool_calls": [calls[0].model_dump()]} if calls else {}),
                }
            )
            if not calls:
                return Turn(content)
            call = calls[0]  # one call per turn, as verl's tool_agent loop executes by default
            try:
                arguments = json.loads(call.function.arguments or "{}")
                if not isinstance(arguments, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError as exc:
                self.malformed += 1
                message = f"Error: the arguments are not a valid JSON object ({exc})."
                self.messages.append({"role": "tool", "tool_call_id": call.id, "content": message})
                continue
            self._pending = call.id
            return Turn(content, (call.function.name, arguments))
        return Turn("")

    def _send_back(self, call_id: str, output: Observation) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output.text})
        if output.png is not None:
            url = "data:image/png;base64," + base64.b64encode(output.png).decode("ascii")
            image = [
                {"type": "text", "text": f"Image returned by {output.tool}:"},
                {"type": "image_url", "image_url": {"url": url}},
            ]
            self.messages.append({"role": "user", "content": image})


def chat_client(settings: ModelSettings):
    import openai

    return openai.OpenAI(base_url=settings.base_url, api_key=settings.api_key, max_retries=2)
