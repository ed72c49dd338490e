"""Model-free readers of case presentations, the case-reasoning environment's scripted baselines.

Both know the synthetic cases' textbook (`lookalikes.py`): a presentation's complaint names its group of
eight look-alikes. `reader` then ranks them by the history (a member's risk factor) and the results: its
abnormal result confirms a member, its normal result excludes it. `symptoms` reads the complaint and the
history and ignores every result. Each writes a short reasoning trace (its differential, why it favours one,
why the others are less likely) and names its candidate. A sample `s` > 0 draws from a softmax over the
scores (temperature 1) with FrozenDraw, so independent samples differ and pass@k can grow with k; sequential
attempts walk down the ranking.
"""

from __future__ import annotations

import math

from case_env.core.frozen import FrozenDraw
from case_env.core.policy import Observation, Turn
from case_env.envs.casereason.lookalikes import GROUPS

AGENTS = ("reader", "symptoms")
GROUP, RISK, CONFIRMS, EXCLUDES = 20.0, 2.0, 10.0, -10.0


class Reader:
    def __init__(self, case_id: str, prompt: str, use_results: bool = True):
        self.case_id = case_id
        text = prompt.lower()
        self.scores: dict[str, float] = {}
        self.evidence: dict[str, list[str]] = {}
        self.excluded: dict[str, str] = {}
        for group in GROUPS:
            for member in group.members:
                score = GROUP if group.complaint.lower() in text else 0.0
                evidence = [f"the patient {member.risk}"] if member.risk.lower() in text else []
                score += RISK * len(evidence)
                if use_results and member.abnormal.lower() in text:
                    score += CONFIRMS
                    evidence.append(f"the {member.test} showed {member.abnormal}")
                if use_results and member.normal.lower() in text:
                    score += EXCLUDES
                    self.excluded[member.name] = f"the {member.test} showed {member.normal}"
                self.scores[member.name], self.evidence[member.name] = score, evidence
        self.ranking = sorted(self.scores, key=lambda n: (-self.scores[n], n))

    def candidate(self, sample: int) -> str:
        if sample == 0:
            return self.ranking[0]
        top = self.scores[self.ranking[0]]
        weights = [math.exp(self.scores[n] - top) for n in self.ranking]
        u = FrozenDraw(sample, f"casereason/sample/{self.case_id}").unit("pick") * sum(weights)
        for name, weight in zip(self.ranking, weights, strict=True):
            u -= weight
            if u <= 0:
                return name
        return self.ranking[-1]

    def trace(self, choice: str) -> str:
        group = [n for n in self.ranking if self.scores[n] >= GROUP + EXCLUDES]  # the complaint's look-alikes
        others = [n for n in group if n != choice and n not in self.excluded][:3]
        ruled_out = [n for n in group if n in self.excluded]
        why = " and ".join(self.evidence[choice]) or "it fits the presentation"
        lines = [
            f"The presentation raises a differential including {', '.join([*others, *ruled_out])} and "
            f"{choice}.",
            f"{choice[:1].upper()}{choice[1:]} is favoured because {why}.",
        ]
        lines += [f"{o[:1].upper()}{o[1:]} is less likely because {self.excluded[o]}." for o in ruled_out]
        lines += [f"{o[:1].upper()}{o[1:]} remains possible." for o in others]
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
