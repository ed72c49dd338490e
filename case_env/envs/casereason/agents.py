"""Model-free readers of case presentations, the case-reasoning environment's scripted baselines.

`reader` ranks the conditions of the clinic's table (its textbook) by how well the presentation's symptoms,
history and demographics fit them, and by any confirming result it finds in the presentation; `symptoms`
ignores the results. Each writes a short reasoning trace (its differential, why it favours one, why the
others are less likely) and names its candidate. A sample `s` > 0 draws from a softmax over the scores
(temperature 1) with FrozenDraw, so independent samples differ and pass@k can grow with k; sequential
attempts walk down the ranking.
"""

from __future__ import annotations

import math

from case_env.core.frozen import FrozenDraw
from case_env.core.policy import Observation, Turn
from case_env.medicine.conditions import CONDITIONS
from case_env.medicine.symptoms import symptom_scores

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
        why = (
            f"the results show {', '.join(self.evidence[choice])}"
            if self.evidence[choice]
            else "the symptoms and history fit it best"
        )
        lines = [
            f"The presentation is a {family} problem; the differential includes {', '.join(others)} and {choice}.",
            f"{choice[:1].upper()}{choice[1:]} is favoured because {why}.",
        ]
        lines += [f"{o[:1].upper()}{o[1:]} is less likely." for o in others]
        return " ".join(lines)

    def answer(self, sample: int = 0) -> str:
        choice = self.candidate(sample)
        return f"<think>\n{self.trace(choice)}\n</think>\n<answer>{choice}</answer>"


def make_reader(name: str, case_id: str, prompt: str) -> Reader:
    if name not in AGENTS:
        raise ValueError(f"unknown case-reasoning agent {name!r}; choose {', '.join(AGENTS)} or openai")
    return Reader(case_id, prompt, use_results=name == "reader")


class SampleReader:
    """One independent sample: the reader's answer straight away, no tool."""

    def __init__(self, reader: Reader, sample: int):
        self.reader, self.sample = reader, sample

    def next_turn(self, observations: list[Observation]) -> Turn:
        return Turn(self.reader.answer(self.sample))


class SequentialReader:
    """Submits the reader's candidates in order until one is accepted or `attempts` are spent, then answers
    with the last one submitted."""

    def __init__(self, reader: Reader, attempts: int):
        self.reader = reader
        self.attempts = attempts

    def next_turn(self, observations: list[Observation]) -> Turn:
        turn = len(observations)
        accepted_or_spent = bool(observations) and not observations[-1].text.startswith(
            "Incorrect. Reconsider"
        )
        if not accepted_or_spent and turn < self.attempts:
            return Turn(call=("submit_diagnosis", {"diagnosis": self.reader.ranking[turn]}))
        choice = self.reader.ranking[max(turn - 1, 0)]
        return Turn(f"<think>\n{self.reader.trace(choice)}\n</think>\n<answer>{choice}</answer>")
