"""A real model behind any OpenAI-compatible chat server (vLLM, SGLang, a hosted API) as an eval agent.

The conversation starts from the row's persona prompt and question; the model sees only the row's tool subset.
Tool text goes back as a `tool` message. Images go back as a user message with an image part right after it,
because the chat format allows text only in tool messages and vLLM and the hosted APIs follow it. A tool call
whose arguments are not valid JSON gets an error reply and the model may try again; the server is not
called. The episode ends at the first reply without a tool call, or when the turn budget runs out.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from case_env.agents.base import Agent, Decision, ToolOutput
from case_env.reward import final_segment, parse_answer


@dataclass(frozen=True)
class ModelSettings:
    base_url: str
    model: str
    api_key: str = "EMPTY"
    max_turns: int = 16
    timeout_s: float = 120.0
    temperature: float = 0.0
    max_tokens: int = 2048


class OpenAIAgent(Agent):
    def __init__(self, extra: dict, prompt: list[dict], tools: list[dict], settings: ModelSettings, client):
        super().__init__(extra)
        self.settings = settings
        self.client = client
        self.tools = tools
        self.messages: list[dict] = [dict(m) for m in prompt]
        self.final = ""
        self.turns = 0
        self._pending: str | None = None  # id of the call whose output has not been sent back yet
        self.malformed = 0

    def next_call(self, outputs: list[ToolOutput]) -> tuple[str, dict] | None:
        if self._pending is not None and outputs:
            self._send_back(self._pending, outputs[-1])
            self._pending = None
        while self.turns < self.settings.max_turns:
            self.turns += 1
            reply = self.client.chat.completions.create(
                model=self.settings.model, messages=self.messages, tools=self.tools or None,
                temperature=self.settings.temperature, max_tokens=self.settings.max_tokens,
                timeout=self.settings.timeout_s,
            ).choices[0].message  # fmt: skip
            calls = reply.tool_calls or []
            self.messages.append({"role": "assistant", "content": reply.content or "",
                                  **({"tool_calls": [c.model_dump() for c in calls[:1]]} if calls else {})})  # fmt: skip
            if not calls:
                self.final = reply.content or ""
                return None
            call = calls[0]  # one call per turn, as verl's tool_agent loop executes by default
            try:
                arguments = json.loads(call.function.arguments or "{}")
                if not isinstance(arguments, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError as exc:
                self.malformed += 1
                self.messages.append({"role": "tool", "tool_call_id": call.id,
                                      "content": f"Error: the arguments are not a valid JSON object ({exc})."})  # fmt: skip
                continue
            self._pending = call.id
            return call.function.name, arguments
        self.final = ""
        return None

    def _send_back(self, call_id: str, output: ToolOutput) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output.text})
        if output.png is not None:
            url = "data:image/png;base64," + base64.b64encode(output.png).decode("ascii")
            self.messages.append({"role": "user", "content": [
                {"type": "text", "text": f"Image returned by {output.tool}:"},
                {"type": "image_url", "image_url": {"url": url}}]})  # fmt: skip

    def decide(self, outputs: list[ToolOutput]) -> Decision:
        letter, _ok = parse_answer(final_segment(self.final))
        return Decision(letter or "", self.final, text=self.final)
