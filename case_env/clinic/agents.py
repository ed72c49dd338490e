"""Model-free clinicians for the clinic environment: a scripted one that examines, and one that never does.

Both ask the same questions and read the answers against the condition table (`case_env.clinic.conditions`,
their textbook); neither sees the case's diagnosis, work-up or noise. The scripted clinician then orders,
one at a time, the exam that would confirm its most likely remaining candidate, reads the findings for that
condition's signature, and stops at the first confirmed one (at most `max_exams`). The no-exam clinician
names its most likely candidate straight away. Their gap is what the environment must show: asking narrows
a case to its presenting problem, only exams tell its conditions apart. Noise reaches them as it would a
doctor: a swapped body part or descriptor misleads the symptom score, a missing or equivocal finding hides
a signature.

An agent is a function of what it has observed so far (`Move` list in, next `Move` out), so the same object
drives direct HTTP evaluation and verl's ToolAgentLoop through `ClinicLoopPolicy`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from case_env.agents.base import tool_call_text
from case_env.clinic.catalogue import parse_exam_string
from case_env.clinic.conditions import CONDITIONS, FAMILIES, Condition

QUESTIONS = ("Hello, what brings you in today?", "What else have you noticed?", "Anything else at all?")
_WORD = re.compile(r"[a-z]+")
_STOP = frozenset({"i", "my", "a", "the", "it", "is", "and", "to", "in", "of", "have", "me", "on", "when",
                   "been", "that", "at", "up", "do", "all", "get", "feel", "feels", "some", "too", "even",
                   "from", "was", "had", "with", "for", "very", "really", "so", "am", "after", "while", "down"})  # fmt: skip


@dataclass
class Move:
    """One assistant turn: a tool call (and what came back) or the final diagnosis."""

    tool: str | None  # ask_patient, order_exam, or None for the diagnosis
    arguments: dict = field(default_factory=dict)
    observation: str = ""
    text: str = ""  # the diagnosis message

    def assistant_text(self) -> str:
        return tool_call_text(self.tool, self.arguments) if self.tool else self.text


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 2}


def _overlap(phrase: str, words: set[str]) -> float:
    mine = _words(phrase)
    return len(mine & words) / len(mine) if mine else 0.0


def _patient_facts(prompt: str) -> tuple[str, int | None]:
    sex = "F" if re.search(r"\bfemale\b", prompt) else "M" if re.search(r"\bmale\b", prompt) else ""
    age = re.search(r"(\d+) years old", prompt)
    return sex, int(age.group(1)) if age else None


def symptom_scores(prompt: str, answers: str) -> dict[str, float]:
    """How well each condition explains the history and the patient's words."""
    said = _words(answers)
    sex, age = _patient_facts(prompt)
    history = _words(prompt.split("medical history:", 1)[-1]) if "medical history:" in prompt else set()
    scores = {}
    for c in CONDITIONS.values():
        family = FAMILIES[c.family]
        score = 2.0 * _overlap(family.complaint.format(severity="", descriptor="", part=family.part), said)
        score += 1.0 if c.descriptor in answers.lower() else 0.0
        score += sum(3.0 for s in c.symptoms if _overlap(s, said) >= 0.6)
        score += 0.7 if re.search(rf"\d+ {c.duration[2][:-1]}", answers.lower()) else 0.0
        score += sum(0.5 for h in c.history if _overlap(h, history) >= 0.6)
        if (c.sex != "any" and sex and c.sex != sex) or (
            age is not None and not c.ages[0] <= age <= c.ages[1]
        ):
            score -= 2.0
        scores[c.name] = score
    return scores


def confirms(condition: Condition, exam: str, findings: str) -> float:
    """1 when the findings show the condition's signature, 0.4 when only equivocally, else 0."""
    words = condition.signature.get(exam, ())
    text = findings.lower()
    if not any(w in text for w in words):
        return 0.0
    return 0.4 if re.search(r"equivocal|non-specific|caution", text) else 1.0


class Clinician:
    """Asks, then examines its candidates in order of likelihood (`max_exams` 0: never examines)."""

    def __init__(self, prompt: str, max_exams: int = 4):
        self.prompt = prompt
        self.max_exams = max_exams

    def next_move(self, done: list[Move]) -> Move:
        asked = [m for m in done if m.tool == "ask_patient"]
        if len(asked) < len(QUESTIONS) and not any("everything" in m.observation for m in asked):
            return Move("ask_patient", {"question": QUESTIONS[len(asked)]})
        answers = " ".join(m.observation for m in asked)
        belief = symptom_scores(self.prompt, answers)
        exams = [m for m in done if m.tool == "order_exam"]
        for move in exams:
            key = parse_exam_string(_call(move.arguments)).key()
            for name in belief:
                belief[name] += 10.0 * confirms(CONDITIONS[name], key, move.observation)
        best = max(belief, key=lambda n: (belief[n], n))
        ordered = {parse_exam_string(_call(m.arguments)).key() for m in exams}
        confirmed = any(confirms(CONDITIONS[best], parse_exam_string(_call(m.arguments)).key(), m.observation) == 1.0
                        for m in exams)  # fmt: skip
        if not confirmed and len(exams) < self.max_exams:
            family = CONDITIONS[best].family
            for name in sorted(belief, key=lambda n: (-belief[n], n)):
                condition = CONDITIONS[name]
                if condition.family != family:
                    continue
                todo = [e for e in condition.signature if e not in ordered]
                if todo:
                    return Move("order_exam", parse_exam_string(todo[0]).as_arguments())
        return Move(None, text=f"The findings fit {best}.\n<answer>{best}</answer>")


def _call(arguments: dict) -> str:
    arguments = dict(arguments)
    name = arguments.pop("exam", "")
    return f"{name}(" + ", ".join(f'{k}="{v}"' for k, v in arguments.items() if v) + ")"


def make_clinician(name: str, prompt: str) -> Clinician:
    if name == "clinician":
        return Clinician(prompt)
    if name == "no-exam":
        return Clinician(prompt, max_exams=0)
    raise ValueError(f"unknown clinic agent {name!r}; choose clinician, no-exam or openai")


_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)


@dataclass
class ClinicLoopPolicy:
    """Drives a Clinician inside verl's ToolAgentLoop (one policy per trajectory): the tool responses are
    read back from the prompt text the loop has built, in the order of the calls this policy made."""

    clinician: Clinician
    moves: list[Move] = field(default_factory=list)

    def __call__(self, prompt_text: str, images: list, turn: int) -> str:
        for move, response in zip(self.moves, _RESPONSE.findall(prompt_text), strict=False):
            move.observation = response.strip()
        move = self.clinician.next_move(self.moves)
        if move.tool:
            self.moves.append(move)
        return move.assistant_text()
