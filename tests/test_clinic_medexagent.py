"""The clinic environment against MedExAgent's own code (`EndlessCG/medexagent`, docs/sources.md): every exam
string its schemas express loads; a row offers its work-up's tools plus the distractors; the default reward
agrees with MedExAgent's tool score, cost penalty, cost totals and format penalty, computed here by formulas
written from its `train/rl/reward.py`, on 100+ (work-up, orders) pairs whether the calls come from verl's
`tool_extra_fields` or from a hermes transcript; and the released model's interface (`ct(...)`, `cbc()`,
`ask_patient`, `[DIAGNOSIS: ...]`) plays through verl's ToolAgentLoop for the expected reward."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import pytest
from verl.tools.tool_registry import load_all_tools

from case_env.core import registry
from case_env.core.bank import write
from case_env.core.calls import FIELD, call_text
from case_env.core.policy import Turn
from case_env.envs.clinic import reward as rewarding
from case_env.envs.clinic.bank import build
from case_env.envs.clinic.cases import ClinicCase, read_csv
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.synth import write_csv
from case_env.medicine.exams import EXAMS, NOT_OFFERED, expressible, read_exam_string, recorded_exam
from case_env.verl.config import path_for
from case_env.verl.rollouts import load_rows, play
from tests import blocking
from tests.server_harness import live_server
from tests.test_clinic_server import env
from tests.verl_rows import REPO

clinic_score = blocking(rewarding.clinic_score)

# -- MedExAgent's formulas, written from train/rl/reward.py (compute_tool_reward, compute_cost_penalty,
# compute_tool_cost_totals, compute_format_penalty) for this test only --------------------------------------
# fmt: off
COST = {  # EXAM_COST (cost, discomfort); a name it lacks is (2, 2)
    "physical_examination": (1, 1), "xray": (1, 1), "ultrasound": (2, 1), "mammography": (1, 2),
    "dexa_scan": (1, 1), "fluoroscopy": (2, 2), "ct": (3, 1), "mri": (3, 2), "angiography": (3, 3),
    "nuclear_scan": (3, 2), "pet_scan": (3, 1), "ecg": (1, 1), "holter_monitor": (2, 1),
    "echocardiogram": (2, 1), "echocardiography": (2, 1), "stress_test": (2, 2),
    "cardiac_catheterization": (3, 3), "cbc": (1, 1), "bmp": (1, 1), "cmp": (1, 1), "lipid_panel": (1, 1),
    "liver_function_test": (1, 1), "renal_function_test": (1, 1), "thyroid_function_test": (1, 1),
    "iron_studies": (1, 1), "coagulation_panel": (1, 1), "blood_gas": (2, 2), "inflammatory_marker": (1, 1),
    "cardiac_enzyme": (1, 1), "hormone_level": (2, 1), "tumor_marker": (2, 1), "drug_level": (2, 1),
    "blood_test": (1, 1), "culture": (2, 1), "serology": (2, 1), "pcr_test": (2, 1), "urinalysis": (1, 1),
    "urine_test": (1, 1), "urine_cytology": (2, 1), "csf_analysis": (2, 3), "stool_test": (1, 1),
    "cytology": (2, 2), "histopathology": (2, 1), "biopsy": (3, 3), "immunohistochemistry": (2, 1),
    "flow_cytometry": (2, 1), "lumbar_puncture": (3, 3), "paracentesis": (3, 3), "thoracentesis": (3, 3),
    "arthrocentesis": (2, 2), "bone_marrow_biopsy": (3, 3), "endoscopy": (3, 2), "amniocentesis": (3, 3),
    "hysterosalpingogram": (2, 2), "eeg": (2, 1), "emg": (2, 2), "evoked_potentials": (2, 1),
    "pulmonary_function_test": (2, 1), "genetic_test": (3, 1), "molecular_test": (3, 1), "eye_exam": (1, 1),
    "skin_test": (1, 1), "allergy_test": (2, 1), "rheumatoid_factor": (1, 1), "viral_load": (2, 1),
    "other": (2, 2),
}
# fmt: on


def ref_tool_reward(pred: list[dict], gt: list[dict]) -> float:
    if not pred and not gt:
        return 1.0
    if not pred or not gt:
        return 0.0
    cp, cg = Counter(t["name"] for t in pred), Counter(t["name"] for t in gt)
    inter = sum(min(cp[k], cg[k]) for k in set(cp) | set(cg))
    union = sum(max(cp[k], cg[k]) for k in set(cp) | set(cg))
    total, possible, left = inter / union, 1.0, list(pred)
    for g in gt:
        gp = g["arguments"]
        possible += 1 + len(gp)
        scores = []
        for i, p in enumerate(left):
            if p["name"] == g["name"]:
                pp = p["arguments"]
                a, b = set(gp), set(pp)
                pn = 1.0 if not a and not b else (0.0 if not a or not b else len(a & b) / len(a | b))
                scores.append(
                    (pn + sum(k in pp and str(gp[k]).lower() == str(pp[k]).lower() for k in gp), -i)
                )
        if scores:
            best, neg = max(scores)
            total += best
            left.pop(-neg)
    return total / possible


def ref_cost(pred: list[dict], gt: list[dict]) -> float:
    budget = Counter(t["name"] for t in gt)
    penalty = 0
    for t in pred:
        if budget[t["name"]]:
            budget[t["name"]] -= 1
        else:
            penalty += sum(COST.get(t["name"], (2, 2)))
    return penalty / 6


def ref_totals(pred: list[dict], gt: list[dict]) -> tuple[float, float, float]:
    names = {t["name"] for t in gt}
    charge = [sum(COST.get(t["name"], (2, 2))) for t in pred]
    unnecessary = sum(c for c, t in zip(charge, pred, strict=True) if t["name"] not in names)
    return sum(charge), unnecessary, sum(sum(COST.get(t["name"], (2, 2))) for t in gt)


# -- the vocabulary ------------------------------------------------------------------------------------------


def test_every_exam_string_medexagents_schemas_express_loads(tmp_path):
    strings = expressible()
    assert len(strings) == 539 and len(EXAMS) == 67
    path = tmp_path / "every_exam.csv"
    rows = [strings[start : start + 9] for start in range(0, len(strings), 9)]  # nine exams per row at most
    write_csv(
        [
            ClinicCase(
                f"r{i}",
                "pmc",
                "gout",
                "pain in my toe",
                exams=tuple(recorded_exam(s, f"result of {s}") for s in row),
            )
            for i, row in enumerate(rows)
        ],
        path,
    )
    load = read_csv(path)
    assert load.problems == []  # 0 left out
    loaded = [e.spelled for c in load.cases for e in c.exams]
    assert loaded == strings
    tools = registry.get("clinic").tools
    for spelled in strings:  # every one is also a valid call of its served tool
        name, arguments = read_exam_string(spelled)
        tools[name].parse(arguments)


def test_a_row_offers_its_workup_tools_plus_the_distractors():
    exams = [
        recorded_exam(s, "x") for s in ('ct(region="chest", contrast="yes")', "cbc()", 'ct(region="head")')
    ]
    cases = [
        ClinicCase(f"c{i}", "pmc", "pneumonia", "a cough, a fever", exams=tuple(exams)) for i in range(20)
    ]
    first = build(cases, 0, (1.0, 0.0, 0.0), NoiseConfig())
    assert build(cases, 0, (1.0, 0.0, 0.0), NoiseConfig()).rows == first.rows  # seeded
    draws = set()
    for row in first.rows["train"]:
        extra = json.loads(row["extra_info"])
        selection = extra["tool_selection"]  # a dialogue row: the patient hears plain text, no tool for it
        assert "ask_patient" not in selection and len(selection) == len(set(selection)) == 2 + 5
        distractors = set(selection) - {"ct", "cbc"}
        assert {"ct", "cbc"} <= set(selection) and len(distractors) == 5 and not distractors & NOT_OFFERED
        draws.add(frozenset(distractors))
    assert len(draws) > 10  # drawn per case
    with_three = build(cases[:3], 0, (1.0, 0.0, 0.0), NoiseConfig(), distractors=3).rows["train"]
    assert all(len(json.loads(r["extra_info"])["tool_selection"]) == 2 + 3 for r in with_three)
    asked = build(cases[:3], 0, (1.0, 0.0, 0.0), NoiseConfig(), patient="ask_patient").rows["train"]
    for row in asked:  # the ask_patient channel: verl's tool_agent, the patient a tool
        assert json.loads(row["extra_info"])["tool_selection"][0] == "ask_patient"
        assert row["agent_name"] == "tool_agent" and [m["role"] for m in row["prompt"]] == ["system", "user"]
    for row in first.rows["train"]:
        assert row["agent_name"] == "medexagent" and [m["role"] for m in row["prompt"]] == ["system"]


# -- the conformance test -----------------------------------------------------------------------------------


def _misspell(arguments: dict, rng: random.Random) -> dict:
    """Other values (some only in upper case, which still match), or a parameter the exam lacks."""
    if not arguments:
        return {"region": "chest"}
    return {k: v.upper() if rng.random() < 0.3 else "other_value" for k, v in arguments.items()}


def _pairs(n: int) -> list[tuple[list[str], list[tuple[str, dict]], list[bool], str]]:
    """(work-up, orders, which orders verl ran, kind) from MedExAgent's vocabulary, every kind of order."""
    rng = random.Random(17)
    vocabulary = expressible()
    kinds = ("exact", "subset", "wrong parameters", "extras", "repeats", "nothing", "mixed", "empty work-up")
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        workup = [] if kind == "empty work-up" else rng.sample(vocabulary, rng.randint(1, 5))
        truth = [read_exam_string(s) for s in workup]
        orders = [(name, dict(args)) for name, args in truth]
        if kind == "subset":
            orders = orders[: max(0, len(orders) - 1 - rng.randint(0, 1))]
        elif kind == "wrong parameters":
            orders = [(name, _misspell(a, rng)) for name, a in orders]
        elif kind == "extras":
            orders += [read_exam_string(s) for s in rng.sample(vocabulary, rng.randint(1, 3))]
        elif kind == "repeats":
            orders += [orders[rng.randrange(len(orders))] for _ in range(rng.randint(1, 3))]
        elif kind == "nothing":
            orders = []
        elif kind in ("mixed", "empty work-up"):
            orders = [read_exam_string(s) for s in rng.sample(vocabulary, rng.randint(0, 4))] + orders[:1]
            rng.shuffle(orders)
            orders.append(("made_up_exam", {"region": "chest"}))  # a name no schema has: cost (2, 2)
        offered = {name for name, _ in truth} | {"ct", "cbc", "ecg"}
        ran = [name in offered for name, _ in orders]  # verl refuses the rest before they reach the server
        out.append((workup, orders, ran, kind))
    return out


def _transcript(orders: list[tuple[str, dict]], doubled: set[int]) -> str:
    turns = [call_text("ask_patient", {"question": "What brings you in?"})]
    for i, (name, arguments) in enumerate(orders):
        if i - 1 in doubled:
            continue  # written in the turn before, as a second call
        calls = call_text(name, arguments)
        if i in doubled and i + 1 < len(orders):
            calls += "\n" + call_text(*orders[i + 1])
        turns.append(calls)
    parts = [f"{t}\nuser\n<tool_response>\nsome result\n</tool_response>" for t in turns]
    return "\n".join([*parts, "assistant\nThe findings fit.\n[DIAGNOSIS: pneumonia]"])


def test_the_default_reward_is_medexagents_on_every_component():
    pairs = _pairs(120)
    assert len(pairs) >= 100 and {k for *_, k in pairs} >= {"exact", "subset", "wrong parameters", "extras"}
    checked = 0
    for workup, orders, ran, kind in pairs:
        doubled = {i for i in range(0, len(orders) - 1, 4)} if kind == "mixed" else set()
        text = _transcript(orders, doubled)
        gt = []
        seen = set()
        for (
            s
        ) in workup:  # MedExAgent's executor: one ground-truth tool per distinct (name, lower-cased values)
            name, arguments = read_exam_string(s)
            key = (name, frozenset((k, v.lower().strip()) for k, v in arguments.items()))
            if key not in seen:
                seen.add(key)
                gt.append({"name": name, "arguments": arguments})
        pred = [{"name": n, "arguments": a} for n, a in orders]
        # verl ran the offered calls, one per turn: the second call of a doubled turn never ran
        second = {i + 1 for i in doubled}
        records = [
            {"tool": "ask_patient", "arguments": {"question": "What brings you in?"}, "status": "ok"},
            *(
                {"tool": n, "arguments": a, "status": "ok" if n in EXAMS else "unknown_tool"}
                for i, ((n, a), r) in enumerate(zip(orders, ran, strict=True))
                if r and i not in second
            ),
        ]
        attempts = sum(1 for i in range(len(orders)) if i not in second)
        errors = sum(1 for i in doubled if i + 1 < len(orders))
        expected_format = errors / attempts if attempts else 0.0
        extra = {"clinic": {"exams": workup}, "tool_selection": ["ask_patient", "ct", "cbc"]}
        for route in ({**extra, FIELD: records}, extra):  # tool_extra_fields, then the transcript alone
            result = clinic_score(text, "Pneumonia", route)
            tool, cost = ref_tool_reward(pred, gt), ref_cost(pred, gt)
            total, unnecessary, truth_cost = ref_totals(pred, gt)
            assert result["tool_match"] == pytest.approx(tool, abs=1e-9) == result["exam_score"]
            assert result["cost"] == pytest.approx(cost, abs=1e-9)
            assert result["format"] == pytest.approx(expected_format, abs=1e-9)
            assert (
                result["tool_cost_total"],
                result["tool_cost_unnecessary"],
                result["tool_cost_ground_truth"],
            ) == (
                pytest.approx(total, abs=1e-9),
                pytest.approx(unnecessary, abs=1e-9),
                pytest.approx(truth_cost, abs=1e-9),
            )
            dx = result["dx"]
            assert dx == 1.0
            assert result["score"] == pytest.approx(
                1.0 * dx + 0.5 * tool - 0.1 * cost - 0.0 * expected_format, abs=1e-9
            )
            checked += 1
    assert checked >= 200


def test_medexagents_worked_values():
    """The values seed-systems.md records from running MedExAgent's code (ground truth xray(chest), cbc())."""
    workup = ['xray(region="chest")', "cbc()"]
    exact = [("xray", {"region": "chest"}), ("cbc", {})]
    cases = {
        "exact": (exact, 1.0, 0.0),
        "ct": ([*exact, ("ct", {"region": "chest", "contrast": "yes"})], 0.917, 0.667),
        "biopsy": ([*exact, ("biopsy", {"site": "lung"})], 0.917, 1.0),
        "wrong region": ([("xray", {"region": "abdomen"}), ("cbc", {})], 0.750, 0.0),
        "none": ([], 0.0, 0.0),
    }
    for orders, tool, cost in cases.values():
        text = _transcript(orders, set())
        result = clinic_score(text, "Pneumonia", {"clinic": {"exams": workup}})
        assert round(result["tool_match"], 3) == tool and round(result["cost"], 3) == cost


# -- the released model's interface through verl's ToolAgentLoop --------------------------------------------


class MedExAgent8B:
    """Turns as MedExAgent-8B writes them: questions, one exam per turn, then [DIAGNOSIS: ...]."""

    def __init__(self, extra_call: tuple[str, dict] | None = None):
        plan = [
            ("ask_patient", {"question": "Hello, what brings you in today?"}),
            ("ask_patient", {"question": "How long have you had the cough?"}),
            ("ct", {"region": "chest", "contrast": "yes"}),
            ("cbc", {}),
        ]
        self.plan = plan + ([extra_call] if extra_call else [])

    def next_turn(self, observations) -> Turn:
        if len(observations) < len(self.plan):
            return Turn("I'd like to check that.", self.plan[len(observations)])
        return Turn("Thank you for your patience. [DIAGNOSIS: community-acquired pneumonia]")


@pytest.fixture(scope="module")
def pneumonia(tmp_path_factory, dataset):
    tmp = tmp_path_factory.mktemp("medexagent-verl")
    path = tmp / "cases" / "pmc_cases.csv"
    exams = (
        recorded_exam(
            'ct(region="chest", contrast="yes")', "Right lower lobe consolidation with air bronchograms"
        ),
        recorded_exam("cbc()", "White cells 15.2 x10^9/L with neutrophilia"),
    )
    symptoms = "a cough with green phlegm for 5 days, fever, pain in my chest when I breathe"
    write_csv(
        [ClinicCase("p", "pmc", "Community-acquired pneumonia", symptoms, "58", "Male", exams=exams)], path
    )
    cases = read_csv(path).cases
    # the ask_patient channel: verl's stock tool_agent, the patient a tool (test_clinic_loop.py plays the
    # default, MedExAgent's own loop)
    bank = build(cases, 0, (1.0, 0.0, 0.0), NoiseConfig(), patient="ask_patient")
    write(bank, tmp / "bank", {"env": "clinic"})
    with env(CASE_ENV_CLINIC_CASES=tmp / "cases"), live_server(dataset, tmp) as live:
        yield tmp / "bank", live


def test_medexagent_8b_calls_play_through_verls_tool_agent_loop(pneumonia, monkeypatch):
    bank, server = pneumonia
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    tools = load_all_tools(tool_config_path=str(REPO / path_for("clinic")), function_tool_path=None)
    (item,) = load_rows(bank / "train.parquet", 1)
    offered = item["extra_info"]["tool_selection"]
    absent = next(name for name in ("mri", "biopsy", "pet_scan", "angiography") if name not in offered)
    outputs, models, scores = asyncio.run(play([item, item], tools, 2, policy=lambda row: MedExAgent8B()))
    out, score = outputs[0], scores[0]
    calls = out.extra_fields[FIELD]
    assert [c["tool"] for c in calls] == ["ask_patient", "ask_patient", "ct", "cbc"]
    assert all(c["status"] == "ok" for c in calls)
    ct = "The CT scan of the chest shows: Right lower lobe consolidation with air bronchograms"
    assert ct in models[0].prompts[-1]  # MedExAgent's result sentence, as the model reads it
    extra = score["reward_extra_info"]
    assert extra["profile"] == "medexagent" and extra["pred"] == "community-acquired pneumonia"
    assert (extra["dx"], extra["tool_match"], extra["cost"], extra["format"]) == (1.0, 1.0, 0.0, 0.0)
    assert score["reward_score"] == pytest.approx(1.5, abs=1e-9)  # 1.0 x 1 + 0.5 x 1 - 0.1 x 0
    # an exam the row does not offer: verl refuses it, and the reward still counts it, as MedExAgent does
    extra_call = (absent, {"region": "chest"} if absent != "biopsy" else {"site": "lung"})
    outputs, _, scores = asyncio.run(play([item], tools, 1, policy=lambda row: MedExAgent8B(extra_call)))
    assert [c["tool"] for c in outputs[0].extra_fields[FIELD]] == ["ask_patient", "ask_patient", "ct", "cbc"]
    pred = [
        {"name": "ct", "arguments": {"region": "chest", "contrast": "yes"}},
        {"name": "cbc", "arguments": {}},
        {"name": extra_call[0], "arguments": extra_call[1]},
    ]
    gt = pred[:2]
    expected = 1.0 + 0.5 * ref_tool_reward(pred, gt) - 0.1 * ref_cost(pred, gt)
    assert scores[0]["reward_score"] == pytest.approx(expected, abs=1e-9) and expected < 1.5


def test_the_medexagent_recipe_composes_and_validates_against_verls_config(tmp_path, capsys):
    from case_env.envs.clinic.synth import make_cases
    from case_env.verl import grpo as grpo_run
    from case_env.verl import launch, options

    write(build(make_cases(20, 0), 0, (0.8, 0.1, 0.1), NoiseConfig()), tmp_path / "bank", {"env": "clinic"})
    argv = ["--dry-run", "--recipe", "medexagent", "--model", "m", "--data", str(tmp_path / "bank")]
    code = grpo_run.main(argv)  # verl's validate_config on CPU
    out = capsys.readouterr().out
    assert "dry run: config composed and validated" in out
    assert code == (2 if "  FAIL " in out else 0)  # no GPU here: the GPU checks fail, the dry run says so
    args, extra = options.parse(argv)
    args.tool_config = grpo_tools = launch.bank_tool_config(tmp_path / "bank")
    config = launch.compose(launch.Plan(args, extra).overrides())
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.entropy_coeff) == (0.2, 0.3, 0.002)
    assert actor.use_kl_loss is False and config.algorithm.use_kl_in_reward is False
    assert (rollout.n, rollout.temperature, rollout.name) == (16, 1.0, "sglang")
    assert (rollout.multi_turn.max_assistant_turns, rollout.multi_turn.max_user_turns) == (20, 15)
    assert (config.data.max_prompt_length, config.data.max_response_length) == (4096, 16384)
    assert (actor.optim.lr, config.data.train_batch_size, config.trainer.total_epochs) == (1e-6, 64, 1)
    # the base recipe is unchanged beside it
    grpo_args, _ = options.parse(argv[:1] + argv[3:])
    grpo_args.tool_config = grpo_tools
    grpo = launch.compose(launch.Plan(grpo_args, []).overrides())
    assert grpo.actor_rollout_ref.actor.use_kl_loss is True and grpo.actor_rollout_ref.rollout.n == 8
    assert grpo.actor_rollout_ref.actor.clip_ratio_high == 0.2


def test_medexagents_verl_parquet_rows_are_cases_with_their_tools_and_noise(tmp_path):
    """A row as MedExAgent's build_verl_dataset writes it: JSON strings inside extra_info."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from case_env.envs.clinic.cases import read_parquet
    from case_env.envs.clinic.noise import plan_noise

    exam_map = {
        'xray(region="chest")': {
            "parsed": {"name": "xray", "arguments": {"region": "chest"}},
            "findings": "Left lower lobe opacity, small effusion",
        },
        "cbc()": {"parsed": {"name": "cbc", "arguments": {}}, "findings": "WBC 14.1"},
    }
    persona = {
        "personality": {"key": "distrust", "label": "Distrust", "instruction": "..."},
        "language_proficiency": {"key": "level_b", "label": "Level B (Moderate)", "instruction": "..."},
        "medical_history_recall": {"key": "low", "label": "Low", "instruction": "..."},
    }
    extra = {
        "patient_index": 12,
        "data_source": "pmc",
        "exam_map": json.dumps(exam_map),
        "available_tools": json.dumps(["cbc", "eeg", "xray", "dexa_scan", "stool_test", "mri", "ecg"]),
        "ground_truth": "Community-acquired pneumonia",
        "demographics": json.dumps(
            {"age": "61", "gender": "Female", "race": "", "additional_demographics": ""}
        ),
        "medical_history": "COPD",
        "self_reported_symptoms": "cough for 3 days, fever, pain in my chest",
        "patient_persona": json.dumps(persona),
        "exam_noise_map": json.dumps({'xray(region="chest")': "omission"}),
        "interaction_kwargs": json.dumps(
            {"name": "patient", "assigned_noise_types": ["self_diagnosis", "vague_answer"]}
        ),
    }
    row = {
        "prompt": [{"role": "system", "content": "You are an experienced physician..."}],
        "reward_model": {"ground_truth": "Community-acquired pneumonia"},
        "data_source": "medagent_pmc",
        "extra_info": extra,
    }
    pq.write_table(
        pa.Table.from_pylist([row, {**row, "extra_info": {"patient_index": 13}}]),
        tmp_path / "train_verl.parquet",
    )
    load = read_parquet(tmp_path / "train_verl.parquet")
    (case,) = load.cases
    assert load.problems == [
        "train_verl.parquet row 1: skipped, not a MedExAgent row (no extra_info.exam_map)"
    ]
    assert case.case_id == "train_verl-00012" and case.data_source == "clinic_pmc" and case.age == "61"
    assert [e.spelled for e in case.exams] == ['xray(region="chest")', "cbc()"]
    assert (case.persona.personality, case.persona.language, case.persona.recall) == ("distrust", "B", "low")
    assert case.offered == ("cbc", "eeg", "xray", "dexa_scan", "stool_test", "mri", "ecg")
    assert case.noise.patient == ("self_diagnosis", "vague_answer") and case.noise.exams == ((0, "omission"),)
    rows = build([case], 0, (1.0, 0.0, 0.0), NoiseConfig(patient_rate=0.3, exam_rate=0.1)).rows["train"]
    extra_row = json.loads(rows[0]["extra_info"])
    assert extra_row["tool_selection"] == list(case.offered)  # its own tools, kept
    noise = NoiseConfig(**extra_row["tools_kwargs"]["ask_patient"]["create_kwargs"]["noise"])
    assert (noise.patient_types, noise.exam_slots, noise.exam_types) == (
        ["self_diagnosis", "vague_answer"],
        [0],
        ["omission"],
    )
    plan = plan_noise(case, noise)
    assert {n.kind for n in plan.patient} == {"self_diagnosis", "vague_answer"} and plan.exams == {
        0: "omission"
    }
    assert all(
        0 <= n.turn < 7 and n.hint for n in plan.patient
    )  # one of the first seven answers, with its hint


def test_noise_is_assigned_dataset_wide_as_medexagent_assigns_it():
    """Exact counts, 1-3 eligible types per noisy patient, exam slots across the bank; and the same draws as
    MedExAgent's plan_dataset_noise_assignments, written here from its data/noise.py."""
    from case_env.envs.clinic import medexagent_noise as mn
    from case_env.envs.clinic.synth import make_cases

    cases = make_cases(90, 5)
    symptoms = [c.symptoms for c in cases]
    findings = [[e.findings for e in c.exams] for c in cases]
    drawn = mn.assign(symptoms, findings, 0.3, 0.1, 42)
    assert len(drawn.patient) == round(90 * 0.3) and all(1 <= len(t) <= 3 for t in drawn.patient.values())
    slots = sum(1 for texts in findings for text in texts if mn.exam_eligible(text))
    assert sum(len(v) for v in drawn.exams.values()) == round(slots * 0.1)

    # the reference: MedExAgent's calls, in its order
    rng = random.Random(42)
    eligible = {i: mn.patient_eligible(s) for i, s in enumerate(symptoms)}
    order = [i for i in eligible if eligible[i]]
    rng.shuffle(order)
    expected = {}
    for i in order[: round(len(symptoms) * 0.3)]:
        types = list(eligible[i])
        rng.shuffle(types)
        expected[i] = tuple(sorted(types[: min(rng.randint(1, 3), len(types))]))
    assert drawn.patient == expected
    all_slots = [(i, s, mn.exam_eligible(t)) for i, texts in enumerate(findings) for s, t in enumerate(texts)]
    all_slots = [x for x in all_slots if x[2]]
    rng = random.Random(43)
    rng.shuffle(all_slots)
    exams: dict[int, dict[int, str]] = {}
    for i, s, types in all_slots[: round(len(all_slots) * 0.1)]:
        exams.setdefault(i, {})[s] = rng.choice(types)
    assert drawn.exams == exams
    # a bank carries each row's share in its create_kwargs
    rows = build(cases, 5, (1.0, 0.0, 0.0), NoiseConfig(patient_rate=0.3, exam_rate=0.1)).rows["train"]
    noisy = [
        json.loads(r["extra_info"])["tools_kwargs"]["cbc"]["create_kwargs"]["noise"]["patient_types"]
        for r in rows
    ]
    assert sum(bool(t) for t in noisy) == 27


def test_every_string_medexagents_parser_reads_loads_and_its_workup_keeps_other(tmp_path):
    """MedExAgent's RL loader keeps every exam string its `parse_exam_string` reads (`name(key="value", ...)`):
    values its `normalize_param_value` folds are folded, others and missing required parameters are kept and
    reported, and `other` stays in the work-up its reward scores."""
    workup = [
        ('physical_examination(type="vital signs")', ("physical_examination", {"type": "vital_signs"})),
        ('culture(source="blood culture")', ("culture", {"source": "blood"})),
        (
            'ct(region="Chest", contrast="with contrast")',
            ("ct", {"region": "chest", "contrast": "with contrast"}),
        ),
        ("xray()", ("xray", {})),
        ('other(description="tilt table test")', ("other", {"description": "tilt table test"})),
    ]
    path = tmp_path / "pmc_cases.csv"
    case = ClinicCase("p", "pmc", "vasovagal syncope", "I fainted twice", "30", "Female")
    write_csv([case], path)
    rows = path.read_text().splitlines()
    header, row = rows[0].split(","), rows[1].split(",")
    for i, (spelled, _) in enumerate(workup, start=1):
        row[header.index(f"exam{i}")] = '"' + spelled.replace('"', '""') + '"'
        row[header.index(f"exam{i}_findings")] = f"finding {i}"
    path.write_text(",".join(header) + "\n" + ",".join(row) + "\n")
    loaded = read_csv(path)
    (case,) = loaded.cases
    assert [(e.call.name, dict(e.call.params)) for e in case.exams] == [call for _, call in workup]
    notes = "\n".join(loaded.problems)
    assert "'vital signs' read as 'vital_signs'" in notes and "xray lacks its required region" in notes
    assert "'with contrast' is not an allowed value; kept as written" in notes
    # the reward's work-up is every exam, `other` included, as MedExAgent's executor holds it (as written)
    pred = [{"name": "ct", "arguments": {"region": "chest", "contrast": "yes"}}]
    gt = [{"name": n, "arguments": dict(read_exam_string(s)[1])} for s, (n, _) in workup]
    text = call_text("ct", pred[0]["arguments"]) + "\n[DIAGNOSIS: vasovagal syncope]"
    score = clinic_score(text, "vasovagal syncope", {"clinic": {"exams": [s for s, _ in workup]}})
    assert score["exams_necessary"] == 5
    assert score["tool_match"] == pytest.approx(ref_tool_reward(pred, gt), abs=1e-12)
    assert score["cost"] == pytest.approx(ref_cost(pred, gt), abs=1e-12)
