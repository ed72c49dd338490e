"""What a policy is: given what its tool calls returned so far, its next turn (a call, or the final answer).

Every scripted baseline and the OpenAI-compatible agent have this one shape, so the same object plays a
row through the eval runner (over HTTP) and through verl's ToolAgentLoop (through `LoopPolicy`, which reads
the tool results back out of the prompt text the loop has built). Policies see the prompt, the row's
public fields and the tool outputs; never the ground truth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from PIL import Image

from case_env.core.calls import call_text

_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)
VISION_END = "<|vision_end|>"


@dataclass
class Observation:
    """What one call returned, as the model sees it (an error's text starts with "Error: ")."""

    tool: str
    arguments: dict[str, Any]
    text: str
    image: Image.Image | None = None
    png: bytes | None = None  # the image as the server encoded it, kept so recordings are byte-exact
    ok: bool = True


@dataclass(frozen=True)
class Turn:
    """One assistant turn: `text` (reasoning, or the whole final answer) and, unless final, one call.
    `reasoning` is what a reasoning model returned apart from its text (`reasoning_content`)."""

    text: str = ""
    call: tuple[str, dict] | None = None
    reasoning: str = ""
    also: tuple[tuple[str, dict], ...] = ()  # more calls of the same turn, where a loop runs them all

    @property
    def final(self) -> bool:
        return self.call is None

    @property
    def calls(self) -> list[tuple[str, dict]]:
        return [self.call, *self.also] if self.call is not None else []

    def written(self, form: str = "hermes") -> str:
        """The turn as the model writes it, its calls in verl's `form`. Reasoning a server returned apart
        (vLLM's reasoning parsers, the vendors' APIs) goes back inside `<think>` where the model wrote it."""
        text = with_thought(self.text, self.reasoning)
        calls = "\n".join(call_text(*call, form) for call in self.calls)
        return f"{text}\n{calls}" if text and calls else text or calls


def with_thought(text: str, reasoning: str | None) -> str:
    """`text` with reasoning that a server returned apart put back inside `<think>` before it, unless the
    text already has its own `<think>` block."""
    if not isinstance(reasoning, str) or not reasoning.strip() or "<think>" in text:
        return text
    return f"<think>\n{reasoning.strip()}\n</think>\n{text}"


class Policy(Protocol):
    def next_turn(self, observations: list[Observation]) -> Turn: ...


_TURN = re.compile(r"<\|im_start\|>(user|assistant)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)


@dataclass
class LoopPolicy:
    """A Policy inside a verl agent loop (one per trajectory), as the scripted model's turn function: what
    its moves got back is read from the prompt text the loop built (user turns after the first assistant
    turn: each `<tool_response>` block is one call's answer, each image with the response that carried it; a
    user turn without one is the reply to words said to `listener`, in a loop that answers plain text), and
    its calls are written in the loop's tool-call format. `listener` is (tool, argument) of such a loop."""

    policy: Any
    form: str = "hermes"
    listener: tuple[str, str] | None = None
    calls: list[tuple[str, dict]] = field(default_factory=list)

    def __call__(self, prompt_text: str, images: list, turn: int) -> str:
        answers: list[str] = []
        started = False
        for role, body in _TURN.findall(prompt_text):
            started = started or role == "assistant"
            if started and role == "user":
                blocks = _RESPONSE.findall(body)
                answers += blocks if blocks else [body.strip()]
        seen = []
        image_iter = iter(images)
        for (tool, arguments), body in zip(self.calls, answers, strict=False):
            text = body.rsplit(VISION_END, 1)[-1].strip()
            image = next(image_iter, None) if VISION_END in body else None
            seen.append(Observation(tool, arguments, text, image, ok=not text.startswith("Error:")))
        move = self.policy.next_turn(seen)
        self.calls += move.calls
        if not move.calls and self.listener is not None:
            tool, argument = self.listener
            self.calls.append((tool, {argument: move.text}))
        return move.written(self.form)
