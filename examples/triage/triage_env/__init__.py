"""Triage from vital signs: a case-env environment in one package, registered by entry point.

A case is one patient's vital signs at arrival; the question is whether the patient needs urgent care. The
rule that decides it (ours, for this example): any vital sign past a red-flag threshold is urgent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from case_env.core.answers import final_segment, last_answer
from case_env.core.bank import BankRow, ExtraInfo
from case_env.core.calls import ScoreExtra
from case_env.core.environment import Component, Score, row_weights, weighted
from case_env.core.frozen import FrozenDraw
from case_env.core.parts import Evaluation, SynthOptions
from case_env.core.personas import Personas
from case_env.core.policy import Turn
from case_env.core.text_cases import Loaded, TextCaseEnvironment
from case_env.core.tools import Tools, schema_version

FLAGS = {"heart_rate": (40, 130), "resp_rate": (8, 24), "spo2": (92, 101), "systolic": (90, 250)}


@dataclass(frozen=True)
class Patient:
    case_id: str
    heart_rate: int
    resp_rate: int
    spo2: int
    systolic: int

    @property
    def level(self) -> str:
        return (
            "urgent" if any(not lo <= getattr(self, k) < hi for k, (lo, hi) in FLAGS.items()) else "routine"
        )


def synthetic(index: int, seed: int) -> Patient:
    d = FrozenDraw(seed, f"triage/{index}")
    vitals = {
        "heart_rate": d.integer("hr", 55, 110),
        "resp_rate": d.integer("rr", 12, 20),
        "spo2": d.integer("spo2", 94, 100),
        "systolic": d.integer("sbp", 100, 150),
    }
    if index % 2:  # every other patient has one red flag
        flag = d.choice("flag", sorted(FLAGS))
        vitals[flag] = {"heart_rate": 145, "resp_rate": 30, "spo2": 85, "systolic": 75}[flag]
    return Patient(f"triage-{index:04d}", **vitals)


class Nurse:
    """The scripted baseline: read the vitals, apply the rule to what they say."""

    def next_turn(self, seen) -> Turn:
        if not seen:
            return Turn(call=("read_vitals", {}))
        numbers = [int(w.rstrip("/min,%")) for w in seen[-1].text.split() if w.rstrip("/min,%").isdigit()]
        patient = Patient("", *numbers)
        return Turn(f"<answer>{patient.level}</answer>")


class TriageEnvironment(TextCaseEnvironment, Evaluation):
    name = "triage"
    title = "triage"
    summary = "Example: decide urgent or routine from vital signs (one tool, one persona)."
    tools = Tools("triage_env.tools")
    personas = Personas("triage_env.personas")
    synth_options = SynthOptions
    components = (Component("acc", 1.0, "the level named is the patient's"),)
    baselines = ("nurse",)
    loop_agent = "nurse"

    def load_cases(self, paths: list[Path]) -> Loaded:
        files = [f for p in paths for f in sorted(p.glob("*.jsonl"))]
        return Loaded([Patient(**json.loads(line)) for f in files for line in f.read_text().splitlines()])

    def synthesize(self, options: SynthOptions, echo: Callable[[str], object]) -> None:
        path = options.out / self.name / "cases.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "".join(json.dumps(asdict(synthetic(i, options.seed))) + "\n" for i in range(options.patients))
        )
        echo(f"wrote {options.patients} triage cases to {path}")

    def case_row(self, case: Patient, index: int, split: str) -> BankRow:
        nurse = self.personas["nurse"]
        version = schema_version(self.tools)
        extra = ExtraInfo.for_case(
            nurse,
            case.case_id,
            index,
            split,
            self.tools,
            version,
            question="Urgent or routine?",
            ground_truth=case.level,
        )
        user = "A patient has arrived. Urgent or routine?"
        return BankRow.chat(nurse.data_source, nurse.system_prompt, user, "triage", extra)

    async def score(self, solution_str: str, ground_truth: str, extra: ScoreExtra | Mapping | None) -> Score:
        answer = (last_answer(final_segment(solution_str)) or "").strip().lower()
        right = float(answer == ground_truth)
        weights = row_weights(self.components, ScoreExtra.read(extra).reward_weights)
        total = weighted(self.components, {"acc": right}, weights)
        return Score(total, right, answer, answer in ("urgent", "routine"))

    def policy_factory(self, agent, bank, seed):
        return lambda item, variant, repeat: Nurse()
