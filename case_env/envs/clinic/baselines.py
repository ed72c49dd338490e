"""Model-free clinicians for the clinic environment: a scripted one that examines, and one that never does.

Both ask the same questions and read the answers against the condition table (`case_env.medicine.conditions`,
their textbook); neither sees the case's diagnosis, work-up or noise. The scripted clinician then orders,
one at a time, the exam that would confirm its most likely remaining candidate, reads the findings for that
condition's signature, and stops at the first confirmed one (at most `max_exams`). The no-exam clinician
names its most likely candidate straight away. Their gap is what the environment must show: asking narrows
a case to its presenting problem, only exams tell its conditions apart. Noise reaches them as it would a
doctor: a swapped body part or descriptor misleads the symptom score, a missing or equivocal finding hides
a signature.

A clinician is a `case_env.core.policy.Policy`: the same object plays a case through the eval runner and
through verl's ToolAgentLoop.
"""

from __future__ import annotations

import re

from case_env.core.calls import chat_call
from case_env.core.policy import Observation, Turn
from case_env.envs.clinic.reward import as_tool
from case_env.medicine.conditions import CONDITIONS, Condition
from case_env.medicine.exams import ExamError, exam_call, parse_exam_string
from case_env.medicine.symptoms import symptom_scores

QUESTIONS = ("Hello, what brings you in today?", "What else have you noticed?", "Anything else at all?")


def confirms(condition: Condition, exam: str, findings: str) -> float:
    """1 when the findings show the condition's signature, 0.4 when only equivocally, else 0."""
    words = condition.signature.get(exam, ())
    text = findings.lower()
    if not any(w in text for w in words):
        return 0.0
    return 0.4 if re.search(r"equivocal|non-specific|caution", text) else 1.0


class Clinician:
    """Asks, then examines its candidates in order of likelihood (`max_exams` 0: never examines), using only
    the exams its prompt offers: MedExAgent's exam tools (`- Name: ct` lines), or `order_exam`."""

    def __init__(self, prompt: str, max_exams: int = 4):
        self.prompt = prompt
        self.max_exams = max_exams
        self.single_tool = '"name": "order_exam"' in prompt
        # MedExAgent's prompt has the doctor talk to the patient in plain text; the ask_patient channel's
        # prompt asks for the tool
        self.speaks = "call ask_patient" not in prompt
        self.questions = QUESTIONS
        self.offered = set(re.findall(r"^- Name: (\w+)$", prompt, re.M))

    def _exam(self, move: Observation) -> str | None:
        """The exam key of a move, or None when it was no exam."""
        if move.tool == "ask_patient":
            return None
        name, arguments = as_tool(move.tool, move.arguments)
        try:
            return exam_call(name, arguments).key()
        except ExamError:
            return None

    def _order(self, key: str) -> Turn:
        call = parse_exam_string(key)
        if self.single_tool:
            return Turn(call=("order_exam", {"exam": call.name, **call.as_arguments()}))
        return Turn(call=(call.name, call.as_arguments()))

    def next_turn(self, done: list[Observation]) -> Turn:
        asked = [m for m in done if m.tool == "ask_patient"]
        if len(asked) < len(self.questions) and not any("everything" in m.text for m in asked):
            question = self.questions[len(asked)]
            return Turn(question) if self.speaks else Turn(call=("ask_patient", {"question": question}))
        answers = " ".join(m.text for m in asked)
        belief = symptom_scores(self.prompt, answers)
        exams = [(key, m.text) for m in done if (key := self._exam(m)) is not None]
        for key, text in exams:
            for name in belief:
                belief[name] += 10.0 * confirms(CONDITIONS[name], key, text)
        best = max(belief, key=lambda n: (belief[n], n))
        ordered = {key for key, _ in exams}
        confirmed = any(confirms(CONDITIONS[best], key, text) == 1.0 for key, text in exams)
        if not confirmed and len(exams) < self.max_exams:
            family = CONDITIONS[best].family
            for name in sorted(belief, key=lambda n: (-belief[n], n)):
                condition = CONDITIONS[name]
                if condition.family != family:
                    continue
                todo = [e for e in condition.signature if e not in ordered and self._can_order(e)]
                if todo:
                    return self._order(todo[0])
        return Turn(f"The findings fit {best}.\n[DIAGNOSIS: {best}]")

    def _can_order(self, key: str) -> bool:
        return self.single_tool or parse_exam_string(key).name in self.offered


class Continuing:
    """A clinician taking over a recorded consultation (MedExAgent's diagnosis protocol): what the record's
    questions and exams got back counts as its own, and it asks nothing more."""

    def __init__(self, clinician: Clinician, prefix: list[dict]):
        self.clinician = clinician
        self.before = recorded_observations(prefix)
        clinician.questions = ()

    def next_turn(self, done: list[Observation]) -> Turn:
        return self.clinician.next_turn(self.before + done)


def recorded_observations(messages: list[dict]) -> list[Observation]:
    """A recorded consultation as a clinician's observations: each tool call with its answer, and each of
    the patient's replies as the answer to the doctor's words before it."""
    out: list[Observation] = []
    calls: dict[str, tuple[str, dict]] = {}
    said = ""
    for message in messages:
        role, text = message.get("role"), str(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            name, arguments = chat_call(call)
            calls[call.get("id", "")] = (name, arguments if isinstance(arguments, dict) else {})
        if role == "assistant":
            said = text
        elif role == "tool" and message.get("tool_call_id") in calls:
            name, arguments = calls.pop(message["tool_call_id"])
            out.append(Observation(name, arguments, text))
        elif role == "user" and said:
            out.append(Observation("ask_patient", {"question": said}, text))
    return out


def make_clinician(name: str, prompt: str, prefix: list[dict] | None = None) -> Clinician | Continuing:
    if name not in ("clinician", "no-exam"):
        raise ValueError(f"unknown clinic agent {name!r}; choose clinician, no-exam or openai")
    clinician = Clinician(prompt, max_exams=4 if name == "clinician" else 0)
    return Continuing(clinician, prefix) if prefix else clinician
