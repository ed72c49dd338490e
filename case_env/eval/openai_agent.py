"""A real model behind any OpenAI-compatible chat server (vLLM, SGLang, a hosted API), as the policy of any
environment's rows.

The model sees the row's prompt and tool subset. Tool text goes back as a `tool` message, images as a user
message right after it (the chat format allows only text in tool messages); the loop runs the first call of a
turn (verl's tool_agent) or all (a dialogue), and a call not run is told so. Calls written in the text (a
server without a tool parser) are read from it and answered as one user turn of `<tool_response>` blocks.
Arguments that are not JSON get an error reply without calling the server. The episode ends as the loop
says, or when the turn budget (every completion requested, retries included) runs out. A reasoning model's
`reasoning_content` is kept as its `<think>` block for the reward and recall, and not sent back.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from case_env.core.calls import TOOL_CALL, written_calls
from case_env.core.policy import Observation, Turn


@dataclass(frozen=True)
class ModelSettings:
    base_url: str
    model: str
    api_key: str = "EMPTY"
    max_turns: int | None = None  # None: the environment's turn budget
    timeout_s: float = 120.0
    temperature: float | None = None  # None: the environment's sample temperature for samples, else 0
    max_tokens: int = 2048
    seed: int | None = None  # sent with every request when set, so a sample can be drawn again


REASONING_FIELDS = ("reasoning_content", "reasoning")
# what a call gets back that the loop did not run (verl's tool_agent runs the first call of a turn)
NOT_RUN = "Error: not run; one call per turn runs."


def reasoning_of(message) -> str:
    """The reasoning an OpenAI-compatible server returned beside the message text, if any."""
    extra = getattr(message, "model_extra", None) or {}
    for name in REASONING_FIELDS:
        value = getattr(message, name, None) or extra.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return ""


class OpenAIPolicy:
    def __init__(
        self,
        prompt: list[dict],
        tools: list[dict],
        settings: ModelSettings,
        client,
        max_turns: int,
        temperature: float | None = None,
        seed: int | None = None,
    ):
        self.settings = settings
        self.temperature = temperature if temperature is not None else settings.temperature or 0.0
        self.seed = settings.seed if seed is None else seed
        self.client = client
        self.tools = tools
        self.max_turns = max_turns
        self.messages: list[dict] = [dict(m) for m in prompt]
        self.turns = 0
        self.malformed = 0
        self._pending: list[str] = []  # ids of the calls whose outputs have not been sent back yet
        self._written = False  # the last turn wrote its calls in its text, not as tool calls
        self._sent = 0  # observations already in the conversation

    def next_turn(self, observations: list[Observation]) -> Turn:
        new = observations[self._sent :]
        self._sent = len(observations)
        if self._written:  # calls written in the text: their results in one user turn
            blocks = [f"<tool_response>\n{output.text}\n</tool_response>" for output in new]
            self.messages.append({"role": "user", "content": "\n".join(blocks)})
        elif self._pending:
            for call_id, output in zip(self._pending, new, strict=False):
                self._send_back(call_id, output)
            for call_id in self._pending[len(new) :]:  # the chat format needs a reply to every call
                self.messages.append({"role": "tool", "tool_call_id": call_id, "content": NOT_RUN})
        else:  # a turn of plain text, answered by whoever the loop gives it to (a dialogue's listener)
            self.messages += [{"role": "user", "content": output.text} for output in new]
        self._pending, self._written = [], False
        while self.turns < self.max_turns:
            self.turns += 1
            sent = [{k: v for k, v in m.items() if k not in REASONING_FIELDS} for m in self.messages]
            reply = (
                self.client.chat.completions.create(
                    model=self.settings.model,
                    messages=sent,
                    tools=self.tools or None,
                    temperature=self.temperature,
                    max_tokens=self.settings.max_tokens,
                    timeout=self.settings.timeout_s,
                    **({"seed": self.seed} if self.seed is not None else {}),
                )
                .choices[0]
                .message
            )
            calls = reply.tool_calls or []
            content = reply.content or ""
            reasoning = reasoning_of(reply)
            self.messages.append(
                {
                    "role": "assistant",
                    "content": content,
                    **({"reasoning_content": reasoning} if reasoning else {}),
                    **({"tool_calls": [c.model_dump() for c in calls]} if calls else {}),
                }
            )
            if not calls:
                written = written_calls(content)
                if not written:
                    return Turn(content, reasoning=reasoning)
                # a model served without a tool parser writes its calls as text (MedExAgent-8B's hermes
                # blocks), as its own evaluation reads them (`parse_tool_call_tag_from_output`)
                self._written = True
                words = TOOL_CALL.sub("", content).strip()  # the turn writes its calls back itself
                return Turn(words, written[0], reasoning, tuple(written[1:]))
            ready, broken = [], []
            for call in calls:  # the loop decides how many run (verl's tool_agent: the first)
                try:
                    arguments = json.loads(call.function.arguments or "{}")
                    if not isinstance(arguments, dict):
                        raise ValueError("arguments must be a JSON object")
                    ready.append((call, arguments))
                except ValueError as exc:
                    broken.append((call, exc))
            for call, exc in broken:
                self.malformed += 1
                message = f"Error: the arguments are not a valid JSON object ({exc})."
                self.messages.append({"role": "tool", "tool_call_id": call.id, "content": message})
            if not ready:
                continue
            self._pending = [call.id for call, _ in ready]
            moves = [(call.function.name, arguments) for call, arguments in ready]
            return Turn(content, moves[0], reasoning, tuple(moves[1:]))
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
