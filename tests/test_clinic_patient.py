"""The simulated patient and the noise model: deterministic, gradual, persona-coloured answers; every noise
type distorts what it should and nothing else; plans depend only on (case, seed, rates)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from case_env.envs.clinic.cases import Persona
from case_env.envs.clinic.context import Exchange
from case_env.envs.clinic.noise import (
    EXAM_NOISE,
    PATIENT_NOISE,
    NoiseConfig,
    NoisePlan,
    PatientNoise,
    noisy_findings,
    plan_noise,
    symptom_units,
    told_units,
)
from case_env.envs.clinic.patient import RulePatient
from case_env.envs.clinic.synth import make_cases

CASES = make_cases(120, seed=0)
MI = next(c for c in CASES if c.diagnosis == "myocardial infarction")
PLAIN = replace(
    MI,
    persona=Persona("plain", "C", "high"),
    symptoms="I have a severe crushing pain in my chest. It started 3 hours ago. I get short of breath. "
    "The pain goes down my left arm.",
)
QUESTIONS = [
    "Hello, what brings you in?",
    "What else have you noticed?",
    "Anything else?",
    "Do you have a fever?",
    "Does the pain go anywhere?",
    "How long has this been going on?",
    "Any medical history?",
]


def converse(patient: RulePatient, questions=QUESTIONS) -> list[str]:
    history: list[Exchange] = []
    for q in questions:
        history.append(Exchange(question=q, answer=patient.answer(q, history)))
    return [e.answer for e in history]


def test_rule_patient_reveals_gradually_and_answers_what_is_asked():
    answers = converse(RulePatient(PLAIN, NoisePlan()))
    assert answers[0] == "I have a severe crushing pain in my chest. It started 3 hours ago."
    assert answers[1] == "I get short of breath. The pain goes down my left arm."
    assert answers[2] == "That's everything I've noticed, really."
    assert answers[3] == "No, I haven't noticed anything like that."
    assert answers[4] == "Yes. The pain goes down my left arm."
    assert answers[5] == "It started 3 hours ago."
    assert answers[6].startswith("Let me see: ") and MI.history in answers[6]


def test_answers_depend_only_on_the_case_plan_question_and_history():
    plan = plan_noise(MI, NoiseConfig(mode="per_case", seed=5, patient_rate=1.0))
    first = converse(RulePatient(MI, plan))
    assert (
        converse(RulePatient(MI, plan_noise(MI, NoiseConfig(mode="per_case", seed=5, patient_rate=1.0))))
        == first
    )
    # a fresh interpreter (another worker) gives the same answers: no hash seeds or process state involved
    code = (
        "from tests.test_clinic_patient import *; "
        "print(converse(RulePatient(MI, plan_noise(MI, NoiseConfig(mode='per_case', seed=5, patient_rate=1.0)))))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str(first)
    # the answer to a question is the same whether the history arrives whole or was built up call by call
    history = [Exchange(question=q, answer=a) for q, a in zip(QUESTIONS, first, strict=True)]
    patient = RulePatient(MI, plan)
    assert patient.answer("Anything else?", history[:2]) == patient.answer("Anything else?", history[:2])
    assert patient.answer("Anything else?", []) != patient.answer("Anything else?", history[:2])


def test_persona_colours_the_answer_without_changing_the_facts():
    facts = converse(RulePatient(PLAIN, NoisePlan()))
    impatient = converse(RulePatient(replace(PLAIN, persona=Persona("impatient", "C", "high")), NoisePlan()))
    assert all(a.startswith("Look, ") and a.endswith("Can we move this along?") for a in impatient)
    assert facts[1] in impatient[1]
    broken = converse(RulePatient(replace(PLAIN, persona=Persona("plain", "A", "high")), NoisePlan()))
    assert broken[0] == "I have severe crushing pain in my chest. It started 3 hours ago."
    forgetful = RulePatient(
        replace(PLAIN, persona=Persona("plain", "C", "low"), history="asthma; gout; eczema"), NoisePlan()
    )
    assert (
        forgetful.answer("Any past medical history?", [])
        == "I don't remember all of it. There's asthma, I think."
    )


def _plan(kind: str, **kw) -> NoisePlan:
    return NoisePlan(patient=[PatientNoise(kind, **kw)])


@pytest.mark.parametrize(
    ("kind", "unit", "told"),
    [
        ("body_part_swap", 0, "I have a severe crushing pain in my upper belly."),
        ("symptom_confusion", 0, "I have a severe stabbing pain in my chest."),
        ("severity_change", 0, "I have a mild crushing pain in my chest."),
        ("temporal_change", 1, None),  # a scaled duration, checked below
        ("omission", 3, None),
    ],
)
def test_each_unit_bound_patient_noise_distorts_its_symptom_every_time_it_is_told(kind, unit, told):
    plan = None
    for seed in range(200):  # the plan draws 1-3 types: find a seed that draws this one
        candidate = plan_noise(PLAIN, NoiseConfig(mode="per_case", seed=seed, patient_rate=1.0))
        if any(n.kind == kind and n.unit == unit for n in candidate.patient):
            plan = candidate
            break
    assert plan is not None
    clean = symptom_units(PLAIN.symptoms)
    units = told_units(PLAIN, plan)
    noise = next(n for n in plan.patient if n.kind == kind)
    if kind == "temporal_change":
        assert units[1] != clean[1] and units[1].startswith("It started ") and "3 hours" not in units[1]
        assert noise.detail.startswith("3 → ")
    elif kind == "omission":
        assert units[3] is None
        answers = converse(RulePatient(PLAIN, NoisePlan(patient=[noise])))
        assert all("left arm" not in a for a in answers)  # never told, not even when asked
        assert answers[4] == "No, I haven't noticed anything like that."
    else:
        assert units[unit] == told
        answers = converse(RulePatient(PLAIN, NoisePlan(patient=[noise])))
        assert told.rstrip(".") in answers[0] and clean[0] not in " ".join(answers)
    untouched = {i for i, n in enumerate(plan.patient) if n.unit is not None}
    assert all(
        units[i] == clean[i]
        for i in range(len(clean))
        if i not in {n.unit for n in plan.patient} and i not in untouched
    )


def test_turn_bound_patient_noise_fires_on_its_turn_only():
    vague = converse(RulePatient(PLAIN, _plan("vague_answer", turn=1)))
    clean = converse(RulePatient(PLAIN, NoisePlan()))
    assert vague[1] in (
        "I can't quite remember, to be honest.",
        "Hmm, I'm not sure. It's hard to say.",
        "I don't really know how to describe it.",
    )
    assert vague[2] == clean[1]  # what the vague answer held back comes out on the next open question
    selfdx = converse(RulePatient(PLAIN, _plan("self_diagnosis", turn=0)))
    assert selfdx[0].startswith(clean[0]) and "I looked it up online and I think it's" in selfdx[0]
    assert selfdx[1:] == clean[1:]


def test_plans_are_per_case_and_seed_and_follow_the_rates():
    config = NoiseConfig(mode="per_case", seed=42, patient_rate=0.3, exam_rate=0.1)
    plans = [plan_noise(c, config) for c in CASES]
    assert [p.metadata(c) for p, c in zip(plans, CASES, strict=True)] == [
        plan_noise(c, config).metadata(c) for c in CASES
    ]
    noisy_patients = sum(bool(p.patient) for p in plans) / len(CASES)
    exams = sum(len(c.exams) for c in CASES)
    noisy_exams = sum(len(p.exams) for p in plans) / exams
    assert 0.18 < noisy_patients < 0.42 and 0.04 < noisy_exams < 0.18
    assert all(1 <= len(p.patient) <= 3 for p in plans if p.patient)
    assert not any(
        plan_noise(c, NoiseConfig(mode="per_case", seed=42)).kinds() for c in CASES
    )  # rates 0: no noise
    other = [
        plan_noise(c, NoiseConfig(mode="per_case", seed=43, patient_rate=0.3, exam_rate=0.1)).kinds()
        for c in CASES
    ]
    assert other != [p.kinds() for p in plans]
    everything = {
        k
        for c in CASES
        for k in plan_noise(c, NoiseConfig(mode="per_case", seed=1, patient_rate=1, exam_rate=1)).kinds()
    }
    assert everything == {f"patient:{k}" for k in PATIENT_NOISE} | {f"exam:{k}" for k in EXAM_NOISE}


@pytest.mark.parametrize("kind", EXAM_NOISE)
def test_each_exam_noise_type(kind):
    findings = "Right lower lobe consolidation with air bronchograms, small effusion."
    noisy = noisy_findings(findings, kind, "case-1", 0, seed=7, mode="per_case")
    assert noisy == noisy_findings(findings, kind, "case-1", 0, seed=7, mode="per_case") and noisy != findings
    if kind == "body_part_swap":
        assert noisy == "Left lower lobe consolidation with air bronchograms, small effusion."
    elif kind == "omission":
        assert noisy in ("small effusion.", "Right lower lobe consolidation with air bronchograms.")
    else:
        assert findings in noisy and ("equivocal" in noisy or "caution" in noisy)
    # nothing to swap or drop: the result becomes ambiguous instead
    if kind != "ambiguity":
        assert "equivocal" in noisy_findings(
            "Normal.", kind, "case-1", 0, 7, "per_case"
        ) or "caution" in noisy_findings("Normal.", kind, "case-1", 0, 7, "per_case")
