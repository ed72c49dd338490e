"""A scripted OpenAI-compatible chat endpoint for tests of the LLM-backed parts (patient simulator, judge,
model agents): it answers each request with `reply(messages)` (a string is the reply's content, a dict the
whole assistant message, tool calls included), optionally after a delay, and records what it was sent."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse


class ScriptedChat:
    def __init__(self, reply: Callable[[list[dict]], Any], delay_s: float = 0.0):
        self.reply = reply
        self.delay_s = delay_s
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)

    async def complete(self, request: Request) -> dict:
        body = await request.json()
        with self.lock:
            self.requests.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        reply = self.reply(body["messages"])
        message = reply if isinstance(reply, dict) else {"role": "assistant", "content": reply}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        if body.get("stream"):
            return StreamingResponse(_chunks(body["model"], message, finish), media_type="text/event-stream")
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        }


def _chunks(model: str, message: dict, finish: str) -> Iterator[str]:
    """The message as OpenAI's streamed chunks: one delta with all of it, the finish, the usage, [DONE]."""
    tool_calls = [{"index": i, **call} for i, call in enumerate(message.get("tool_calls") or [])]
    delta = {"role": "assistant", "content": message.get("content")} | (
        {"tool_calls": tool_calls} if tool_calls else {}
    )
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    for choices, extra in (
        ([{"index": 0, "delta": delta, "finish_reason": None}], {}),
        ([{"index": 0, "delta": {}, "finish_reason": finish}], {}),
        ([], {"usage": usage}),
    ):
        chunk = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0, "model": model}
        yield f"data: {json.dumps(chunk | {'choices': choices} | extra)}\n\n"
    yield "data: [DONE]\n\n"
