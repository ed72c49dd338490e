"""Model-free readers of case presentations, the case-reasoning environment's scripted baselines.

`reader` ranks the conditions of the clinic's table (its textbook) by how well the presentation's symptoms,
history and demographics fit them, and by any confirming result it finds in the presentation; `symptoms`
ignores the results. Each writes a short reasoning trace (its differential, why it favours one, why the
others are less likely) and names its candidate. A sample `s` > 0 draws from a softmax over the scores
(temperature 1) with FrozenDraw, so independent samples differ and pass@k can grow with k; sequential
attempts walk down the ranking.
"""

from __future__ import annotations

import json
import math
import re

from case_env.clinic.agents import symptom_scores
from case_env.clinic.conditions import CONDITIONS
from case_env.synth.frozen import FrozenDraw

AGENTS = ("reader", "symptoms")


class Reader:
    def __init__(self, case_id: str, prompt: str, use_results: bool = True):
        self.case_id = case_id
        text = prompt.lower()
        scores = symptom_scores(prompt, prompt)
        self.evidence: dict[str, list[str]] = {name: [] for name in scores}
        if use_results:
            for name, condition in CONDITIONS.items():
                for words in condition.signature.values():
                    hits = [w for w in words if w in text]
                    if hits:
                        scores[name] += 10.0
                        self.evidence[name] += hits
        self.scores = scores
        self.ranking = sorted(scores, key=lambda n: (-scores[n], n))

    def candidate(self, sample: int) -> str:
        if sample == 0:
            return self.ranking[0]
        weights = [math.exp(self.scores[n] - self.scores[self.ranking[0]]) for n in self.ranking]
        u = FrozenDraw(sample, f"casereason/sample/{self.case_id}").unit("pick") * sum(weights)
        for name, weight in zip(self.ranking, weights, strict=True):
            u -= weight
            if u <= 0:
                return name
        return self.ranking[-1]

    def trace(self, choice: str) -> str:
        others = [n for n in self.ranking[:4] if n != choice][:3]
        family = CONDITIONS[choice].family.replace("_", " ")
        why = (f"the results show {', '.join(self.evidence[choice])}" if self.evidence[choice]
               else "the symptoms and history fit it best")  # fmt: skip
        lines = [f"The presentation is a {family} problem; the differential includes {', '.join(others)} and {choice}.",
                 f"{choice[:1].upper()}{choice[1:]} is favoured because {why}."]  # fmt: skip
        lines += [f"{o[:1].upper()}{o[1:]} is less likely." for o in others]
        return " ".join(lines)

    def answer(self, sample: int = 0) -> str:
        choice = self.candidate(sample)
        return f"<think>\n{self.trace(choice)}\n</think>\n<answer>{choice}</answer>"


def make_reader(name: str, case_id: str, prompt: str) -> Reader:
    if name not in AGENTS:
        raise ValueError(f"unknown case-reasoning agent {name!r}; choose {', '.join(AGENTS)} or openai")
    return Reader(case_id, prompt, use_results=name == "reader")


_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)


class SequentialReader:
    """Drives a Reader inside verl's ToolAgentLoop on sequential rows: it submits its candidates in order until
    one is accepted or `attempts` are spent, reading the feedback back from the prompt text, then answers."""

    def __init__(self, reader: Reader, attempts: int):
        self.reader = reader
        self.attempts = attempts

    def __call__(self, prompt_text: str, images: list, turn: int) -> str:
        replies = _RESPONSE.findall(prompt_text)
        accepted_or_spent = bool(replies) and not replies[-1].startswith("Incorrect. Reconsider")
        if not accepted_or_spent and turn < self.attempts:
            call = json.dumps(
                {"name": "submit_diagnosis", "arguments": {"diagnosis": self.reader.ranking[turn]}}
            )
            return f"<tool_call>\n{call}\n</tool_call>"
        choice = self.reader.ranking[max(turn - 1, 0)]
        return f"<think>\n{self.reader.trace(choice)}\n</think>\n<answer>{choice}</answer>"
