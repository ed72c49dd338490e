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

    @property
    def final(self) -> bool:
        return self.call is None

    def written(self, form: str = "hermes") -> str:
        """The turn as the model writes it, its call in verl's `form`. Reasoning a server returned apart
        (vLLM's reasoning parsers, the vendors' APIs) goes back inside `<think>` where the model wrote it."""
        text = with_thought(self.text, self.reasoning)
        if self.call is None:
            return text
        call = call_text(*self.call, form)
        return f"{text}\n{call}" if text else call


def with_thought(text: str, reasoning: str | None) -> str:
    """`text` with reasoning that a server returned apart put back inside `<think>` before it, unless the
    text already has its own `<think>` block."""
    if not isinstance(reasoning, str) or not reasoning.strip() or "<think>" in text:
        return text
    return f"<think>\n{reasoning.strip()}\n</think>\n{text}"


class Policy(Protocol):
    def next_turn(self, observations: list[Observation]) -> Turn: ...


def transcript(turns: list[Turn], observations: list[Observation]) -> str:
    """An episode as verl decodes it for the reward: each turn, its tool response, then the final turn."""
    parts = []
    for i, turn in enumerate(turns):
        parts.append(turn.written())
        if i < len(observations):
            parts.append(f"user\n<tool_response>\n{observations[i].text}\n</tool_response>")
    return "\n".join(parts)


@dataclass
class LoopPolicy:
    """A Policy inside verl's ToolAgentLoop (one per trajectory), as the scripted model's turn function: the
    tool responses are read back from the prompt text in the order of the calls this policy made, each
    image with the response that carried it; the call is written in the loop's tool-call format."""

    policy: Any
    form: str = "hermes"
    calls: list[tuple[str, dict]] = field(default_factory=list)

    def __call__(self, prompt_text: str, images: list, turn: int) -> str:
        responses = _RESPONSE.findall(prompt_text)
        seen = []
        image_iter = iter(images)
        for (tool, arguments), body in zip(self.calls, responses, strict=False):
            text = body.rsplit(VISION_END, 1)[-1].strip()
            image = next(image_iter, None) if VISION_END in body else None
            seen.append(Observation(tool, arguments, text, image, ok=not text.startswith("Error:")))
        move = self.policy.next_turn(seen)
        if move.call is not None:
            self.calls.append(move.call)
        return move.written(self.form)
