"""A small OpenAI-compatible chat server for tests: it plays the model-free policy through the chat protocol.

Each request carries the whole conversation, so the stub rebuilds the tool outputs from it (text from `tool`
messages, pixels from the image parts that follow) and asks the scripted policy for its next move. Its first
move in every conversation is a tool call with malformed JSON arguments, which the client must survive.
"""

from __future__ import annotations

import base64
import io
import json
import threading

from fastapi import FastAPI, Request
from PIL import Image

from case_env.core.policy import Observation
from case_env.envs.imaging.baselines import scripted_agent

MALFORMED = "bad_0"


class StubModel:
    def __init__(self, extras_by_question: dict[str, dict]):
        self.extras = extras_by_question
        self.lock = threading.Lock()
        self.images_seen = 0
        self.malformed_replies = 0
        self.tool_names_offered: list[set[str]] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)

    async def complete(self, request: Request) -> dict:
        body = await request.json()
        messages = body["messages"]
        extra = self.extras[messages[1]["content"]]
        with self.lock:
            self.tool_names_offered.append({t["function"]["name"] for t in body.get("tools") or []})
        if not any(m["role"] == "assistant" for m in messages):
            return _reply(
                [
                    {
                        "id": MALFORMED,
                        "type": "function",
                        "function": {"name": "list_visits", "arguments": "{not json"},
                    }
                ]
            )
        outputs = self._outputs(messages)
        agent = scripted_agent(extra)
        move = agent.next_call(outputs)
        if move is None:
            return _reply(None, agent.decide(outputs).final_message())
        name, arguments = move
        return _reply(
            [
                {
                    "id": f"call_{len(outputs)}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ]
        )

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


def _reply(tool_calls: list[dict] | None, content: str | None = None) -> dict:
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": "stub",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
