"""What a policy without a model looks like: it asks for tool calls one at a time, then names a letter.

The same agent drives a verl ToolAgentLoop (through `LoopPolicy`, which reads tool results back out of the
prompt) and, later, direct HTTP evaluation. Agents see the question, its options and the tool outputs; the
only privileged input they may use is the row's `evidence` list (which calls expose the answer), never the
ground truth.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)


@dataclass
class ToolOutput:
    tool: str
    arguments: dict[str, Any]
    text: str
    image: Image.Image | None = None
    png: bytes | None = None  # the image as the server encoded it, kept so recordings are byte-exact


@dataclass
class Decision:
    letter: str
    reason: str
    text: str | None = None  # a model's own final message; policies without a model leave it to the runner

    def final_message(self) -> str:
        return self.text if self.text is not None else f"{self.reason}\n<answer>{self.letter}</answer>"


class Agent:
    """Override `next_call` and `decide`. `extra` is the row's extra_info (question, options, evidence)."""

    def __init__(self, extra: dict):
        self.extra = extra
        self.options: dict[str, str] = extra["options"]

    def next_call(self, outputs: list[ToolOutput]) -> tuple[str, dict] | None:
        raise NotImplementedError

    def decide(self, outputs: list[ToolOutput]) -> Decision:
        raise NotImplementedError

    def option_where(self, test) -> str | None:
        """The first letter whose option text satisfies `test`."""
        return next((letter for letter, text in self.options.items() if test(text)), None)


def tool_call_text(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@dataclass
class LoopPolicy:
    """Adapts an Agent to verl's ToolAgentLoop: turn n of the scripted model is the agent's next move."""

    agent: Agent
    calls: list[tuple[str, dict]] = field(default_factory=list)

    def __call__(self, prompt_text: str, images: list, turn: int) -> str:
        responses = _RESPONSE.findall(prompt_text)
        outputs = []
        image_iter = iter(images)
        for (tool, arguments), body in zip(self.calls, responses, strict=False):
            text = body.rsplit("<|vision_end|>", 1)[-1].strip()
            image = next(image_iter, None) if "<|vision_end|>" in body else None
            outputs.append(ToolOutput(tool, arguments, text, image))
        move = self.agent.next_call(outputs)
        if move is not None:
            self.calls.append(move)
            return tool_call_text(*move)
        decision = self.agent.decide(outputs)
        return decision.final_message()
