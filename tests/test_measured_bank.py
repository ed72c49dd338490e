"""Imaging banks on real-data-shaped roots: questions from the measurements when no phantom manifest
exists, clinical tables in the shapes UK Biobank users have, and the measured truth checked against the
generator's manifests on the same patients."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from case_env.core.bank import write
from case_env.envs.imaging.bank.build import build
from case_env.envs.imaging.clinical import DIAGNOSES, ParticipantKeys, load_clinical, read_clinical
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.icd10 import chapter_of, imaging_visible, normalise_code
from case_env.envs.imaging.synth.patient import plan_patient
from tests.conftest import SEED


@pytest.fixture(scope="module")
def real_shaped(dataset, tmp_path_factory) -> Path:
    """The synthetic root with every phantom manifest removed: what real data looks like."""
    root = tmp_path_factory.mktemp("no-manifests") / "root"
    shutil.copytree(dataset, root)
    for manifest in root.rglob("*_phantom.json"):
        manifest.unlink()
    return root


def _clinical(store: PatientStore) -> dict:
    table = load_clinical(store)
    assert table is not None and not table.problems, table and table.problems
    return table.diagnoses


def _answers(result) -> dict[tuple, str]:
    out = {}
    for rows in result.rows.values():
        for row in rows:
            extra = json.loads(row["extra_info"]) if isinstance(row["extra_info"], str) else row["extra_info"]
            key = (extra["patient_id"], extra["template"], extra["question"])
            out[key] = extra["options"][row["reward_model"]["ground_truth"]]
    return out


@pytest.fixture(scope="module")
def banks(dataset, real_shaped):
    measured_store = PatientStore(real_shaped)
    measured = build(measured_store, 5, (0.8, 0.1, 0.1), "measured", _clinical(measured_store))
    manifest = build(PatientStore(dataset), 5, (0.8, 0.1, 0.1), "manifest")
    return measured, manifest


def test_a_root_without_manifests_gets_questions_for_all_three_personas(banks):
    measured, _ = banks
    counts = {}
    for split_counts in measured.counts().values():
        for source, n in split_counts.items():
            counts[source] = counts.get(source, 0) + n
    assert set(counts) == {"vista3d_opsd", "medpanel_v2_opsd", "medboard_opsd"}, counts
    assert min(counts.values()) >= 10, counts
    templates = {key[1] for key in _answers(measured)}
    assert {"organ_volume", "liver_change", "fat_direction", "lesion_status", "claim"} <= templates
    assert {"interval_diagnosis", "prior_diagnosis"} <= templates
    # only a generator knows a fat-water swap from a true change: skipped, counted, with the reason
    assert "artefact_vs_change" not in templates
    assert measured.skipped_by_template["artefact_vs_change"] == {"needs a phantom manifest": 10}


def test_measured_truth_agrees_with_manifest_truth(banks):
    measured, manifest = _answers(banks[0]), _answers(banks[1])
    common = sorted(set(measured) & set(manifest))
    assert len(common) >= 60
    disagree = [(k, measured[k], manifest[k]) for k in common if measured[k] != manifest[k]]
    assert len(disagree) <= 0.01 * len(common), disagree
    # the comparison is not empty in the templates where the two truths are computed differently
    assert {k[1] for k in common} >= {"liver_change", "fat_direction", "lesion_status"}


def test_bank_json_counts_every_skip_by_template_and_reason(real_shaped, tmp_path):
    from case_env.core.registry import get
    from case_env.envs.imaging.environment import ImagingBankOptions

    built = get("imaging").build_bank(ImagingBankOptions(data_root=real_shaped, out=tmp_path, seed=5))
    write(built.result, tmp_path, built.meta)
    summary = json.loads((tmp_path / "bank.json").read_text())
    assert summary["truth"] == "measured" and summary["clinical"].endswith(str(DIAGNOSES))
    by_template = summary["skipped_by_template"]
    assert by_template["artefact_vs_change"]["needs a phantom manifest"] == 10
    # every skipped question is one line of "skipped" and one count of its template's reason
    assert sum(sum(r.values()) for r in by_template.values()) == len(summary["skipped"])
    assert any(
        line.endswith("needs a phantom manifest: true change or fat-water swap is known only to a generator")
        for line in summary["skipped"]
    )


def test_diagnosis_options_share_one_chapter_and_none_is_a_real_answer(banks):
    rows = [r for rows in banks[0].rows.values() for r in rows]
    seen_none = seen_code = 0
    for row in rows:
        extra = json.loads(row["extra_info"]) if isinstance(row["extra_info"], str) else row["extra_info"]
        if extra["template"] not in ("interval_diagnosis", "prior_diagnosis"):
            continue
        correct = extra["options"][row["reward_model"]["ground_truth"]]
        codes = [normalise_code(t.split()[0]) for t in extra["options"].values() if not t.startswith("None")]
        assert len(extra["options"]) == 4 and any(
            t.startswith("None of these") for t in extra["options"].values()
        )
        # one chapter whatever the answer, so the options' chapters never tell "none" from a code
        assert len({chapter_of(c) for c in codes}) == 1, extra["options"]
        assert all(imaging_visible(c) for c in codes)
        if correct.startswith("None"):
            seen_none += 1
        else:
            seen_code += 1
    assert seen_none and seen_code


def test_the_synthetic_clinical_table_matches_the_scenarios(dataset):
    store = PatientStore(dataset)
    diagnoses = _clinical(store)
    for index, pid in enumerate(store.patient_ids()):
        plan = plan_patient(SEED, index)
        assert plan.public_id == pid
        visits = {v.visit: v.acq_date for v in store.patient(pid).visits}
        records = {r.code: r for r in diagnoses.get(pid, [])}
        for dx in plan.scenario.icd10:
            recorded = records[dx.code].recorded
            present_before = plan.scenario.name in ("steatosis_regression", "growing_liver_lesion") or (
                plan.scenario.name == "renal_cyst" and plan.scenario.lesions[0].diameters_mm[0] is not None
            )
            if present_before:
                assert recorded < visits["baseline"], (pid, dx.code)
            else:
                assert visits["baseline"] <= recorded <= visits["follow_up"], (pid, dx.code)
        incidental = [c for c in records if c not in {d.code for d in plan.scenario.icd10}]
        assert all(not imaging_visible(c) for c in incidental)  # true, but no image shows them


@pytest.mark.parametrize(
    ("text", "code"),
    [("K760", "K76.0"), ("k76.0", "K76.0"), ("I10", "I10"), ("C787", "C78.7"), ("N281 ", "N28.1")],
)
def test_icd10_codes_are_read_with_or_without_the_dot(text, code):
    assert normalise_code(text) == code


def test_clinical_tables_in_uk_biobank_shapes(dataset, tmp_path):
    store = PatientStore(dataset)
    keys = ParticipantKeys.of(store)
    first, second = store.patient_ids()[:2]
    eid1, eid2 = store.patient(first).fields["eid"], store.patient(second).fields["eid"]
    # wide, as a showcase export of fields 41270 (codes) and 41280 (dates), codes without the dot
    wide = tmp_path / "wide.tsv"
    wide.write_text(
        "eid\t41270-0.0\t41270-0.1\t41280-0.0\t41280-0.1\n"
        f"{eid1}\tK760\tI10\t2017-05-01\t2012-03-04\n"
        f"{eid2}\tR161\t\t2016-02-02\t\n"
    )
    table = read_clinical(wide, keys)
    assert not table.problems
    assert [(r.code, r.recorded) for r in table.diagnoses[first]] == [
        ("I10", date(2012, 3, 4)),
        ("K76.0", date(2017, 5, 1)),
    ]
    assert table.diagnoses[first][1].title.startswith("Fatty (change of) liver")
    # long, comma-separated, keyed by eid
    long = tmp_path / "long.csv"
    long.write_text(f"eid,code,date\n{eid2},N28.1,2015-01-01\n{eid2},N28.1,2014-06-01\n")
    table = read_clinical(long, keys)
    assert [(r.code, r.recorded) for r in table.diagnoses[second]] == [("N28.1", date(2014, 6, 1))]


def test_a_bad_clinical_table_row_is_named_and_the_rest_is_used(dataset, tmp_path):
    store = PatientStore(dataset)
    keys = ParticipantKeys.of(store)
    sub = store.patient(store.patient_ids()[0]).subject
    path = tmp_path / "diagnoses.tsv"
    path.write_text(
        "participant_id\tcode\tdate\n"
        f"{sub}\tK76.0\t2017-01-01\n"
        f"{sub}\tXYZ\t2017-01-01\n"
        f"{sub}\tR16.1\t2017-13-40\n"
        "sub-9999\tK76.0\t2017-01-01\n"
        f"{sub}\tC78.7\t1900-01-01\n"
        f"{sub}\tK99.9\t2017-01-01\n"
    )
    table = read_clinical(path, keys)
    assert [r.code for r in table.diagnoses[store.patient_ids()[0]]] == ["K76.0"]
    assert table.problems == [
        "diagnoses.tsv line 3: 'XYZ' is not an ICD-10 code (e.g. K76.0 or K760)",
        "diagnoses.tsv line 4: date '2017-13-40' of R16.1 is not a date between 1901-01-01 and today (YYYY-MM-DD)",
        "diagnoses.tsv line 5: participant sub-9999 is not in the data root's participants.tsv",
        "diagnoses.tsv line 6: date '1900-01-01' of C78.7 is not a date between 1901-01-01 and today (YYYY-MM-DD)",
        "diagnoses.tsv line 7: K99.9 is in no ICD-10 chapter (unknown code)",
    ]
    wrong_columns = tmp_path / "other.tsv"
    wrong_columns.write_text("person\tdiagnosis\nx\ty\n")
    problem = read_clinical(wrong_columns, keys).problems
    assert problem and "expected columns participant_id or eid, code and date" in problem[0]


def test_bank_build_takes_a_clinical_file_and_reports_its_bad_rows(real_shaped, tmp_path):
    import subprocess
    import sys

    def bank_build(clinical: Path) -> subprocess.CompletedProcess:
        args = [
            "bank",
            "build",
            "--data-root",
            str(real_shaped),
            "--out",
            str(out),
            "--clinical",
            str(clinical),
        ]
        return subprocess.run(
            [sys.executable, "-m", "case_env.cli", *args], capture_output=True, text=True, timeout=600
        )

    table = tmp_path / "dx.tsv"
    table.write_text("eid\tcode\tdate\n9999999\tK76.0\t2017-01-01\n")
    out = tmp_path / "bank"
    result = bank_build(table)
    assert result.returncode == 0, result.stderr
    assert "dx.tsv line 2: eid 9999999 is not in the data root's participants.tsv" in result.stderr
    summary = json.loads((out / "bank.json").read_text())
    assert summary["clinical"] == str(table) and summary["problems"]
    assert pq.read_table(out / "train.parquet").num_rows > 0
    missing = bank_build(tmp_path / "absent.tsv")
    assert missing.returncode == 2 and "absent.tsv: no such file" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_the_no_tool_baseline_uses_a_real_tell_and_ignores_leave_out_noise():
    from case_env.envs.imaging.baselines.naive import LeavePatientOut

    def row(patient: str, n: int, truth: str) -> dict:
        letters = "ABCD"[n % 4 :] + "ABCD"[: n % 4]  # the smallest number moves through the letters
        options = {letter: f"{10 * n + k} mL" for k, letter in enumerate(letters)}
        return {"patient_id": patient, "template": "leaky", "options": options, "ground_truth": truth}

    leaky = [row(f"p{i}", i, "ABCD"[i % 4]) for i in range(40)]  # the keyed answer is the smallest number
    prior = LeavePatientOut(leaky).for_patient("p0")
    assert [prior.pick(r) for r in leaky] == [r["ground_truth"] for r in leaky]
    # a balanced template: the leave-out makes p0's class the rarest of the rest, which is no tell
    balanced = [{**row(f"p{i}", 0, "A"), "ground_truth": "ABCD"[i % 4]} for i in range(40)]
    assert LeavePatientOut(balanced).for_patient("p0").pick(balanced[0]) is None


def test_data_check_sets_our_volumes_beside_uk_biobank_phenotypes(dataset, tmp_path):
    from case_env.core.registry import get
    from case_env.envs.imaging.idps import IDPS

    root = tmp_path / "root"
    shutil.copytree(dataset, root)
    check = get("imaging").check_data(root)
    assert check.summary["phenotypes"].endswith(str(IDPS))
    compared = [line for line in check.lines if line.startswith("  case0001 baseline:")]
    assert compared and "liver PDFF" in compared[0] and "spleen" in compared[0]
    assert not [w for w in check.warnings if "UK Biobank's phenotype" in w]  # the phantom agrees within 1 %
    table = root / IDPS
    lines = table.read_text().splitlines()
    cells = lines[1].split("\t")
    cells[3] = str(float(cells[3]) * 1.5)  # case0001's baseline liver: half as large again
    lines[1] = "\t".join(cells)
    lines.append("sub-9999\t\t2\t1500\tn/a\tn/a\tn/a\tn/a\tn/a")
    lines.append(f"{cells[0]}\t\t7\t1500\tn/a\tn/a\tn/a\tn/a\tn/a")
    table.write_text("\n".join(lines) + "\n")
    warnings = get("imaging").check_data(root).warnings
    assert any(w.startswith("case0001 baseline: liver measures") and "(-33.2 %)" in w for w in warnings), (
        warnings
    )
    assert any("idps.tsv line 22: participant sub-9999 is not in the data root" in w for w in warnings), (
        warnings
    )
    assert any("idps.tsv line 23: case0001 has no visit instance 7" in w for w in warnings), warnings


def test_scripted_agents_solve_the_measured_truth_bank(real_shaped, tmp_path):
    from case_env.eval.runner import run_eval
    from tests.server_harness import live_server

    store = PatientStore(real_shaped)
    bank = tmp_path / "bank"
    write(build(store, 5, (0.8, 0.1, 0.1), "measured", _clinical(store)), bank, {"env": "imaging"})
    with live_server(real_shaped, tmp_path / "server") as server:
        text = run_eval(bank, server.url, "scripted", tmp_path / "scripted", concurrency=3, progress=False)
        vision = run_eval(bank, server.url, "vision", tmp_path / "vision", concurrency=3, progress=False)
    for source in ("vista3d_opsd", "medboard_opsd"):
        assert text["by_data_source"][source]["accuracy"] >= 0.98, text["by_data_source"]
    assert vision["by_data_source"]["medpanel_v2_opsd"]["accuracy"] >= 0.90, vision["by_data_source"]
