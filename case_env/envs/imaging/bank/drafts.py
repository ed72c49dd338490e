"""Questions before letters: what a template produces, and how options become A-D without tells.

Three rules keep a model from answering without tools (docs/architecture.md, "Banks"):
- Numeric distractors are drawn from the same population as the truth (other patients' measured values),
  so the true value is exchangeable with them: neither its rank nor its closeness to a population norm
  gives it away.
- The correct letter cycles through A-D in a seed-shuffled order per data source, so letters are balanced
  to within one question.
- Categorical templates are balanced per answer class (`balance`), so the most common class of a
  template is not a free win.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from case_env.core.frozen import FrozenDraw
from case_env.envs.imaging.terms import Persona

N_OPTIONS = 4
LETTERS = "ABCD"


class SkipError(ValueError):
    """A template cannot ask its question for this patient: the measurement is missing or too close to
    call. `reason` is the short form bank.json counts per template; the message adds the values."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class DistractorError(SkipError):
    """No set of distractors far enough from the truth and from each other: the question is not asked."""

    def __init__(self, detail: str):
        super().__init__("no separated distractors", detail)


@dataclass
class Draft:
    persona: Persona
    template: str
    category: str  # the answer class, for balancing ("numeric" for numeric templates)
    patient_id: str
    stem: str
    correct: str
    distractors: list[str]
    evidence: list[dict]  # [{"tool": ..., "arguments": {...}}]
    insight: str

    def key(self) -> str:
        return f"{self.patient_id}/{self.template}/{self.stem}"


@dataclass
class BankContext:
    """What templates may consult beyond the patient's own facts."""

    imaging: Any  # case_env.envs.imaging.viewer.service.Imaging, for slice positions through lesions
    population: dict  # measured values of all patients, for numeric distractors


def call(tool: str, **arguments: Any) -> dict:
    """One evidence entry: a tool call that exposes the deciding fact."""
    return {"tool": tool, "arguments": arguments}


@dataclass
class Question:
    draft: Draft
    options: dict[str, str]
    answer: str  # letter


@dataclass
class LetterCycle:
    """Positions of the correct answer, cycling through seed-shuffled permutations of A-D."""

    draw: FrozenDraw
    counts: dict[str, int] = field(default_factory=dict)

    def next(self, group: str) -> int:
        n = self.counts.get(group, 0)
        self.counts[group] = n + 1
        block = self.draw.shuffled(f"{group}:{n // N_OPTIONS}", list(range(N_OPTIONS)))
        return block[n % N_OPTIONS]


def assign_letters(drafts: list[Draft], draw: FrozenDraw) -> list[Question]:
    cycle = LetterCycle(draw.child("letters"))
    out = []
    for draft in drafts:
        position = cycle.next(draft.persona.value)
        others = draw.shuffled(f"order:{draft.key()}", draft.distractors)
        texts = [*others[:position], draft.correct, *others[position:]]
        out.append(Question(draft, dict(zip(LETTERS, texts, strict=True)), LETTERS[position]))
    return out


def balance(drafts: list[Draft], draw: FrozenDraw) -> list[Draft]:
    """Per template, cap every answer class at the median class size (numeric templates are untouched)."""
    out = []
    by_template = sorted(drafts, key=lambda d: d.template)
    for template, group in groupby(by_template, key=lambda d: d.template):
        items = list(group)
        classes: dict[str, list[Draft]] = {}
        for d in items:
            classes.setdefault(d.category, []).append(d)
        if set(classes) == {"numeric"}:
            out += items
            continue
        sizes = sorted(len(v) for v in classes.values())
        cap = max(1, math.ceil(sizes[(len(sizes) - 1) // 2]))
        for category, members in sorted(classes.items()):
            ordered = sorted(members, key=lambda d: draw.unit(f"balance:{template}:{category}:{d.key()}"))
            out += ordered[:cap]
    return out


def numeric_distractors(
    truth: float,
    pool: list[float],
    draw: FrozenDraw,
    separated,
    fallback_spread: float,
    jitter: float = 0.03,
) -> list[float]:
    """Three values from the population `pool` (lightly jittered) that are all pairwise `separated` from
    each other and from the truth. Falls back to log-normal draws around the pool's median."""
    values = [v for v in pool if v > 0]
    for attempt in range(3000):
        if len(values) >= 3:
            picks = [
                values[draw.integer(f"pick:{attempt}:{i}", 0, len(values) - 1)]
                * math.exp(draw.normal(f"jit:{attempt}:{i}", 0.0, jitter))
                for i in range(3)
            ]
        else:
            centre = sorted(values)[len(values) // 2] if values else truth
            picks = [
                centre * math.exp(draw.normal(f"fb:{attempt}:{i}", 0.0, fallback_spread)) for i in range(3)
            ]
        candidates = [truth, *picks]
        if all(separated(a, b) for i, a in enumerate(candidates) for b in candidates[i + 1 :]):
            return picks
    raise DistractorError(f"truth {truth}")
