"""Clinic cases: the exam catalogue's strict canonical form, MedExAgent's CSV and JSONL read into one shape,
problems reported rather than guessed, and the synthetic generator's round trip through the same loader."""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import replace

import pytest

from case_env.envs.clinic.cases import SOURCES, load_cases, read_csv, read_jsonl
from case_env.envs.clinic.synth import CSV_COLUMNS, make_cases, write_csv, write_jsonl
from case_env.medicine.conditions import CONDITIONS, FAMILIES
from case_env.medicine.exams import EXAMS, ExamError, exam_call, parse_exam_string


def test_exam_strings_parse_to_one_canonical_form():
    a = parse_exam_string('ct(region="chest", contrast="yes")')
    b = parse_exam_string('ct(contrast="YES", region="chest")')
    assert a == b and a.key() == 'ct(contrast="yes", region="chest")'
    assert parse_exam_string("cbc") == parse_exam_string("cbc()") == exam_call("cbc", {})
    # as MedExAgent's executor keys its exams: a left-out contrast is another exam, and both echo tools exist
    assert parse_exam_string('ct(region="head")') != parse_exam_string('ct(region="head", contrast="no")')
    assert parse_exam_string("echocardiography()").name == "echocardiography"
    assert (
        parse_exam_string("blood_gas(arterial)").key() == 'blood_gas(type="arterial")'
    )  # its positional form
    assert a.describe() == "CT scan (contrast yes, region chest)"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("mri_brain_special()", "unknown exam 'mri_brain_special'"),
        ('xray(region="moon")', "xray region must be one of head, neck, chest"),
        ("xray()", "xray needs region"),
        ('bmp(region="chest")', "bmp does not take region (it takes no parameters)"),
        ("ct(region=", "not an exam call"),
        (
            "ct(contrast='yes', region=chest)",
            "cannot read the arguments",
        ),  # MedExAgent reads only key="value"
    ],
)
def test_an_exam_the_catalogue_cannot_express_is_refused_by_name(text, problem):
    with pytest.raises(ExamError) as error:
        parse_exam_string(text)
    assert problem in str(error.value)


def test_catalogue_covers_medexagents_exam_names_and_tiers():
    # the 12 groups of MedExAgent's tools (seed-systems.md §2.3) and its EXAM_COST extremes (§2.6)
    for name in (
        "xray",
        "ct",
        "mri",
        "pet_scan",
        "ecg",
        "cbc",
        "culture",
        "urinalysis",
        "biopsy",
        "lumbar_puncture",
        "endoscopy",
        "eeg",
        "pulmonary_function_test",
        "genetic_test",
        "audiometry",
    ):
        assert name in EXAMS
    assert EXAMS["biopsy"].charge == EXAMS["lumbar_puncture"].charge == 6
    assert (
        EXAMS["mri"].charge == 5 and EXAMS["xray"].charge == EXAMS["ecg"].charge == EXAMS["cbc"].charge == 2
    )


def test_synthetic_cases_round_trip_through_the_csv_and_jsonl_loaders(tmp_path):
    cases = make_cases(60, seed=3)
    assert make_cases(60, seed=3) == cases and make_cases(60, seed=4) != cases  # deterministic per seed
    assert Counter(c.diagnosis for c in cases) == Counter({name: 2 for name in CONDITIONS})  # balanced
    assert len(CONDITIONS) == 30 and len(FAMILIES) == 6
    write_csv(cases, tmp_path / "clinic_synthetic.csv")
    write_jsonl(cases, tmp_path / "clinic_synthetic.jsonl")
    with (tmp_path / "clinic_synthetic.csv").open() as handle:
        assert csv.DictReader(handle).fieldnames == CSV_COLUMNS
    from_csv = read_csv(tmp_path / "clinic_synthetic.csv")
    from_jsonl = read_jsonl(tmp_path / "clinic_synthetic.jsonl")
    assert from_csv.problems == from_jsonl.problems == []
    # a case table's empty fields are what pandas makes of them in MedExAgent's prompt ("nan")
    assert [replace(c, blank="") for c in from_csv.cases] == cases and from_csv.cases[0].blank == "nan"
    # the JSONL carries the persona the CSV row is given; it also keeps its recorded conversation and gold calls
    assert [replace(c, conversation=(), gold=()) for c in from_jsonl.cases] == cases
    assert all(c.conversation and len(c.gold) == len(c.exams) for c in from_jsonl.cases)
    assert all(1 <= len(c.exams) <= 9 for c in cases)
    assert {c.data_source for c in cases} == {"clinic_synthetic"}


def test_medexagent_rows_load_and_bad_rows_are_reported(tmp_path):
    path = tmp_path / "train_patients.csv"
    rows = [
        {
            "age": "54 years",
            "gender": "M",
            "diagnosis": "Pneumonia",
            "self_reported_symptoms": "Cough and fever.",
            "exam1": 'xray(region="chest")',
            "exam1_findings": "Right lower lobe consolidation.",
            "exam2": 'ct(region="thorax", contrast="yes")',
            "exam2_findings": "Consolidation.",
            "exam3": "cbc()",
            "exam3_findings": "WBC 15.",
            "source": "ddxplus",
        },
        {"age": "30", "gender": "F", "diagnosis": "", "self_reported_symptoms": "Headache.", "source": "pmc"},
        {
            "age": "61",
            "gender": "F",
            "diagnosis": "Gout",
            "self_reported_symptoms": "Toe pain.",
            "source": "pmc",
        },
    ]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(
            handle,
            [
                "age",
                "gender",
                "diagnosis",
                "self_reported_symptoms",
                "exam1",
                "exam1_findings",
                "exam2",
                "exam2_findings",
                "exam3",
                "exam3_findings",
                "source",
                "original_text",
            ],
        )
        writer.writeheader()
        writer.writerows(rows)
    loaded = load_cases([path])
    assert [c.case_id for c in loaded.cases] == ["train_patients-00000", "train_patients-00002"]
    first = loaded.cases[0]
    assert first.data_source == SOURCES["ddxplus"] == "clinic_ddxplus"
    assert loaded.cases[1].data_source == "clinic_pmc"
    # every exam MedExAgent's parser reads is kept, a value outside the allowed list as written and reported
    assert [e.call.key() for e in first.exams] == [
        'xray(region="chest")',
        'ct(contrast="yes", region="thorax")',
        "cbc()",
    ]
    assert first.demographics() == "54 years, male"
    assert loaded.problems == [
        "train_patients.csv row 2: exam 'ct(region=\"thorax\", contrast=\"yes\")': ct region 'thorax' is not an "
        "allowed value; kept as written (as MedExAgent's loader keeps it)",
        "train_patients.csv row 3: skipped, no diagnosis",
    ]


def test_eval_jsonl_exams_come_from_tool_calls_answered_by_tool_messages(tmp_path):
    record = {
        "patient_id": 7,
        "diagnosis": "URTI",
        "self_reported_symptoms": "Sore throat.",
        "demographics": {"age": 33, "gender": "F", "race": "", "additional_demographics": ""},
        "patient_persona": {
            "personality": {"key": "impatient", "label": "Impatient"},
            "language_proficiency": {"key": "level_a", "label": "Level A (Low)"},  # MedExAgent's keys
            "medical_history_recall": {"key": "low", "label": "Low"},
        },
        "conversation": [
            {"role": "system", "content": "..."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "culture", "arguments": '{"source": "throat"}'},
                    },
                    {"id": "c2", "type": "function", "function": {"name": "cbc", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "No group A streptococcus."},
            {"role": "assistant", "content": "[DIAGNOSIS: URTI]"},
        ],
    }
    path = tmp_path / "ddxplus_test.jsonl"
    path.write_text(json.dumps(record) + "\n\n{not json}\n[1]\n")
    loaded = read_jsonl(path)
    (case,) = loaded.cases
    assert case.case_id == "ddxplus_test-7" and case.source == "ddxplus" and case.age == "33"
    assert [(e.call.key(), e.findings) for e in case.exams] == [
        ('culture(source="throat")', "No group A streptococcus.")
    ]
    assert (case.persona.personality, case.persona.language, case.persona.recall) == ("impatient", "A", "low")
    assert loaded.problems[0].startswith("ddxplus_test.jsonl line 3: skipped, not JSON")
    assert loaded.problems[1] == "ddxplus_test.jsonl line 4: skipped, not a JSON object"


def test_findings_match_strictly_by_every_parameter():
    case = make_cases(30, seed=0)[0]
    for exam in case.exams:
        assert case.findings(exam.call) == [(case.exams.index(exam), exam.findings)]
    xray_chest = parse_exam_string('xray(region="chest")')
    pneumonia = next(c for c in make_cases(60, seed=0) if c.diagnosis == "community-acquired pneumonia")
    assert pneumonia.findings(xray_chest)
    for other in ("abdomen", "head", "spine"):  # MedExAgent returned the chest findings here
        assert pneumonia.findings(parse_exam_string(f'xray(region="{other}")')) == []


def test_clinic_bank_rows_follow_the_schema_and_hide_the_answer(tmp_path):
    from case_env.core import registry
    from case_env.core.bank import write
    from case_env.core.validate import validate
    from case_env.envs.clinic.bank import build
    from case_env.envs.clinic.noise import NoiseConfig

    cases = make_cases(40, seed=2)
    noise = NoiseConfig(seed=9, patient_rate=0.5, exam_rate=0.2)
    result = build(cases, seed=2, fractions=(0.8, 0.1, 0.1), noise=noise)
    assert build(cases, seed=2, fractions=(0.8, 0.1, 0.1), noise=noise).rows == result.rows  # reproducible
    write(result, tmp_path, {"env": "clinic"})
    assert sum(len(v) for v in result.cases.values()) == 40
    assert not set(result.cases["train"]) & set(result.cases["test"])  # cases never cross splits
    by_id = {c.case_id: c for c in cases}
    noisy, systems = 0, set()
    for split in ("train", "val", "test"):
        check = validate(tmp_path / f"{split}.parquet")
        assert check.ok, check.problems
        for row in result.rows[split]:
            extra = json.loads(row["extra_info"])
            case = by_id[extra["patient_id"]]
            assert row["data_source"] == "clinic_synthetic" and row["agent_name"] == "medexagent"
            assert row["reward_model"]["ground_truth"] == case.diagnosis == extra["ground_truth"]
            assert set(extra["tools_kwargs"]) == set(registry.get("clinic").tools)
            row_noise = extra["tools_kwargs"]["ask_patient"]["create_kwargs"]["noise"]
            assert all(
                v["create_kwargs"] == {"patient_id": case.case_id, "noise": row_noise}
                for v in extra["tools_kwargs"].values()
            )
            assert row_noise["mode"] == "dataset" and row_noise["patient_rate"] == 0.5
            workup = list(dict.fromkeys(e.call.name for e in case.exams))
            offered = extra["tool_selection"]  # the patient hears plain text: no tool for it
            assert "ask_patient" not in offered and set(workup) <= set(offered)
            assert len(offered) == len(workup) + 5 and "other" not in offered  # the work-up + 5 distractors
            assert extra["clinic"]["exams"] == [e.spelled for e in case.exams]
            noisy += bool(extra["noise"]["labels"])
            system = row["prompt"][0]["content"]
            systems.add(system)
            assert all(f"- Name: {name}\n" in system for name in offered)
            head = system.split("AVAILABLE EXAMINATIONS")[0]  # the exam list's values may name a disease
            assert "[DIAGNOSIS:" in system and case.diagnosis.lower() not in head.lower()
            assert [m["role"] for m in row["prompt"]] == ["system"]  # MedExAgent's: a system message only
            prompt = head.lower()
            assert case.symptoms.split(".")[0].lower() not in prompt  # neither the patient's symptoms ...
            assert not any(e.findings.lower() in prompt for e in case.exams)  # ... nor any finding
            assert f"age: {case.age}\n" in prompt and "order_exam" not in prompt
            assert "INSTRUCTIONS:\n- Only output what you would say directly to the patient" in system
            assert "<answer>" not in system and "nan" not in head.split()
    # MedExAgent's dataset-level draw: exactly round(40 x 0.5) noisy patients, whatever the exam noise adds
    assert noisy >= 20 and len(systems) == 40


def test_train_and_test_files_given_together_keep_their_own_splits(tmp_path):
    """MedExAgent's README layout: `rl/train_patients.csv` and `eval/*_test_*` files; the bank keeps them apart,
    whatever the fractions say, so its test patients never reach training."""
    from case_env.envs.clinic.bank import build
    from case_env.envs.clinic.noise import NoiseConfig

    write_csv(make_cases(12, 0), tmp_path / "rl" / "train_patients.csv")
    write_csv(make_cases(5, 1, stem="held"), tmp_path / "eval" / "pmc_test_cases.csv")
    write_csv(make_cases(3, 2, stem="other"), tmp_path / "eval" / "pmc_val_cases.csv")
    cases = load_cases([tmp_path / "rl", tmp_path / "eval"]).cases
    result = build(cases, 0, (0.8, 0.1, 0.1), NoiseConfig())
    by_file = {s: sorted(c.case_id for c in cases if c.split == s) for s in ("train", "val", "test")}
    assert {s: sorted(ids) for s, ids in result.cases.items()} == by_file
    assert [len(by_file[s]) for s in ("train", "val", "test")] == [12, 3, 5]


def test_empty_cells_appear_in_the_prompt_as_medexagents_builder_prints_them(tmp_path):
    """MedExAgent reads its case table with pandas: an empty cell is NaN, which its prompt builder prints
    ("Race/Ethnicity: nan"); a model trained on its prompts saw them. `--empty-cells omit` leaves them out,
    as the builder's docstring says it does; a conversation file's empty fields were never NaN."""
    from case_env.envs.clinic.bank import build
    from case_env.envs.clinic.noise import NoiseConfig

    case = make_cases(1, 0)[0]
    write_csv([replace(case, race="", other_demographics="", history="")], tmp_path / "cases.csv")
    (loaded,) = read_csv(tmp_path / "cases.csv").cases
    assert (loaded.race, loaded.blank) == ("", "nan")

    def system(**options) -> str:
        (row,) = build([loaded], 0, (1.0, 0.0, 0.0), NoiseConfig(), **options).rows["train"]
        return row["prompt"][0]["content"]

    faithful = system()
    assert f"Age: {case.age}\nGender: {case.gender}\nRace/Ethnicity: nan\nOther: nan\n" in faithful
    assert "PATIENT'S MEDICAL HISTORY:\nnan\n" in faithful
    omitted = system(empty_cells="omit")
    assert f"Gender: {case.gender}\n\nPATIENT'S MEDICAL HISTORY:\nNo known past medical history." in omitted
    asked = system(patient="ask_patient")  # our own prompt: never "nan"
    assert "nan" not in asked.split()
