"""What a model-free imaging policy looks like: it asks for tool calls one at a time, then names a letter.

An `Agent` is a `case_env.core.policy.Policy`: the same object plays a row through the eval runner and
through verl's ToolAgentLoop. Agents see the question, its options and the tool outputs; the only
privileged input they may use is the row's `evidence` list (which calls expose the answer), never the
ground truth.
"""

from __future__ import annotations

from dataclasses import dataclass

from case_env.core.policy import Observation, Turn


@dataclass
class Decision:
    letter: str
    reason: str

    def final_message(self) -> str:
        return f"{self.reason}\n<answer>{self.letter}</answer>"


class Agent:
    """Override `next_call` and `decide`. `extra` is the row's extra_info (question, options, evidence)."""

    def __init__(self, extra: dict):
        self.extra = extra
        self.options: dict[str, str] = extra["options"]

    def next_call(self, outputs: list[Observation]) -> tuple[str, dict] | None:
        raise NotImplementedError

    def decide(self, outputs: list[Observation]) -> Decision:
        raise NotImplementedError

    def next_turn(self, observations: list[Observation]) -> Turn:
        move = self.next_call(observations)
        if move is not None:
            return Turn(call=move)
        return Turn(self.decide(observations).final_message())

    def option_where(self, test) -> str | None:
        """The first letter whose option text satisfies `test`."""
        return next((letter for letter, text in self.options.items() if test(text)), None)
