"""A small OpenAI-compatible chat server for tests: it plays the model-free policy through the chat protocol.

Each request carries the whole conversation, so the stub rebuilds the tool outputs from it (text from `tool`
messages, pixels from the image parts that follow) and asks the scripted policy for its next move. Its first
move in every conversation is a tool call with malformed JSON arguments, which the client must survive.
"""

from __future__ import annotations

import base64
import io
import json

from PIL import Image

from case_env.core.policy import Observation
from case_env.envs.imaging.baselines import scripted_agent
from tests.chat_stub import ScriptedChat

MALFORMED = "bad_0"


class StubModel(ScriptedChat):
    """The scripted policy behind the tests' one chat endpoint (`ScriptedChat`), its question's row found by
    the conversation's first user message."""

    def __init__(self, extras_by_question: dict[str, dict]):
        super().__init__(self.move)
        self.extras = extras_by_question
        self.images_seen = 0
        self.malformed_replies = 0

    @property
    def tool_names_offered(self) -> list[set[str]]:
        return [{t["function"]["name"] for t in body.get("tools") or []} for body in self.requests]

    def move(self, messages: list[dict]) -> dict:
        extra = self.extras[messages[1]["content"]]
        if not any(m["role"] == "assistant" for m in messages):
            return _reply([_call(MALFORMED, "list_visits", "{not json")])
        outputs = self._outputs(messages)
        agent = scripted_agent(extra)
        move = agent.next_call(outputs)
        if move is None:
            return _reply(None, agent.decide(outputs).final_message())
        name, arguments = move
        return _reply([_call(f"call_{len(outputs)}", name, json.dumps(arguments))])

    def _outputs(self, messages: list[dict]) -> list[Observation]:
        calls: dict[str, tuple[str, dict]] = {}
        outputs: list[Observation] = []
        for message in messages:
            for call in message.get("tool_calls") or []:
                if call["id"] != MALFORMED:
                    calls[call["id"]] = (call["function"]["name"], json.loads(call["function"]["arguments"]))
            if message["role"] == "tool":
                if message["tool_call_id"] == MALFORMED:
                    assert message["content"].startswith("Error: the arguments are not a valid JSON object")
                    with self.lock:
                        self.malformed_replies += 1
                    continue
                name, arguments = calls[message["tool_call_id"]]
                outputs.append(Observation(name, arguments, message["content"]))
            elif message["role"] == "user" and isinstance(message["content"], list):
                url = next(p["image_url"]["url"] for p in message["content"] if p["type"] == "image_url")
                png = base64.b64decode(url.split(",", 1)[1])
                outputs[-1].image = Image.open(io.BytesIO(png)).convert("RGB")
                outputs[-1].png = png
                with self.lock:
                    self.images_seen += 1
        return outputs


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _reply(tool_calls: list[dict] | None, content: str | None = None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}
