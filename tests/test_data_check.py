"""`case-env data check` end to end: good roots pass, each kind of bad input gets its own clear message."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from case_env.envs.imaging.data import layout
from tests.conftest import tree_snapshot
from tests.test_data_store import SUB, copy_patient


def run_cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {"CASE_ENV_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "case_env.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_a_generated_root_checks_clean(dataset, tmp_path):
    result = run_cli("data", "check", str(dataset), "--json", cache=tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["problems"] == [] and report["warnings"] == []
    assert [p["patient_id"] for p in report["patients"]] == [f"case{i:04d}" for i in range(1, 11)]
    first = report["patients"][0]
    assert [v["visit"] for v in first["visits"]] == ["baseline", "follow_up"]
    organs = first["visits"][0]["organs"]
    assert 1000 < organs["liver"] < 2300 and "right_kidney" in organs and "left_iliopsoas" in organs
    table = run_cli("data", "check", str(dataset), cache=tmp_path / "cache")
    assert table.returncode == 0 and "check: ok" in table.stdout
    assert "case0010" in table.stdout and "liver" in table.stdout


def _corrupt_gzip(root: Path) -> None:
    path = root / layout.channel_image(SUB, "ses-01", "water")
    path.write_bytes(path.read_bytes()[:-5000])


def _not_gzip(root: Path) -> None:
    (root / layout.channel_image(SUB, "ses-02", "fat")).write_bytes(b"\x1f\x8b\x08" + b"not really gzip" * 50)


def _missing_channel(root: Path) -> None:
    (root / layout.channel_image(SUB, "ses-02", "opp")).unlink()


def _label_grid(root: Path) -> None:
    path = root / layout.organ_labels(SUB, "ses-01")
    img = nib.load(path)
    data = np.asanyarray(img.dataobj)[::2, ::2, ::2]
    nib.save(nib.Nifti1Image(np.ascontiguousarray(data), img.affine @ np.diag([2, 2, 2, 1])), path)


def _ragged_sessions(root: Path) -> None:
    (root / layout.sessions_tsv(SUB)).write_text("session_id\tacq_time\nses-01\t2016-01-01\nses-02\n")


def _duplicate_sessions(root: Path) -> None:
    (root / layout.sessions_tsv(SUB)).write_text(
        "session_id\tacq_time\nses-01\t2016-01-01\nses-01\t2018-01-01\n"
    )


def _bad_volumes_table(root: Path) -> None:
    path = root / layout.organ_volumes(SUB, "ses-02")
    path.write_text(path.read_text().replace("\tliver\t", "\tliver\textra\t", 1))


def _bad_report_json(root: Path) -> None:
    (root / layout.report(SUB, "ses-01", "json")).write_text("{not json")


CASES = [
    (_corrupt_gzip, f"{SUB}/ses-01/anat/{SUB}_ses-01_acq-dixon_rec-water_T1w.nii.gz", "truncated or corrupt"),
    (_not_gzip, f"{SUB}/ses-02/anat/{SUB}_ses-02_acq-dixon_rec-fat_T1w.nii.gz", "not a readable NIfTI file"),
    (_missing_channel, f"{SUB}/ses-02/anat", "missing Dixon channel 'opp'"),
    (_label_grid, f"{SUB}_ses-01_acq-dixon_desc-organs_dseg.nii.gz", "label grid 56x44x93"),
    (_ragged_sessions, f"{SUB}/{SUB}_sessions.tsv", "line 3 has 1 field(s), the header has 2"),
    (_duplicate_sessions, f"{SUB}/{SUB}_sessions.tsv", "duplicate session label 'ses-01'"),
    (_bad_volumes_table, f"{SUB}_ses-02_acq-dixon_desc-organs_volumes.tsv", "cannot read volumes table"),
    (_bad_report_json, f"{SUB}_ses-01_desc-radiology_report.json", "not valid JSON"),
]


@pytest.mark.parametrize(("damage", "path", "message"), CASES, ids=[c[0].__name__[1:] for c in CASES])
def test_each_bad_input_gets_a_clear_message(dataset, tmp_path, damage, path, message):
    root = copy_patient(dataset, tmp_path / "root")
    damage(root)
    before = tree_snapshot(root)
    result = run_cli("data", "check", str(root), cache=tmp_path / "cache")
    assert result.returncode == 1
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem: ")]
    assert any(path in line and message in line for line in problems), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert str(tmp_path) not in "\n".join(problems)  # paths relative to the root, as the server needs
    assert tree_snapshot(root) == before  # nothing written into the user's tree
    as_json = json.loads(run_cli("data", "check", str(root), "--json", cache=tmp_path / "cache").stdout)
    assert any(path in p and message in p for p in as_json["problems"])


def test_problems_are_reported_once_each_and_others_still_checked(dataset, tmp_path):
    root = copy_patient(dataset, tmp_path / "root")
    _corrupt_gzip(root)
    _missing_channel(root)
    result = run_cli("data", "check", str(root), "--json", cache=tmp_path / "cache")
    report = json.loads(result.stdout)
    assert len(report["problems"]) == len(set(report["problems"])) == 2
    follow = report["patients"][0]["visits"][1]
    assert follow["organs"]["liver"] > 1000  # the damaged visit's neighbour still measured


@pytest.mark.parametrize(
    ("make_root", "message"),
    [
        (lambda p: p / "nowhere", "does not exist"),
        (lambda p: p.mkdir() or p, "contains no subjects"),
        (lambda p: (p.write_text("x"), p)[1], "is not a directory"),
    ],
)
def test_missing_or_empty_roots(tmp_path, make_root, message):
    root = make_root(tmp_path / "root")
    result = run_cli("data", "check", str(root), cache=tmp_path / "cache")
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_subjects_without_sessions_are_reported(tmp_path):
    (tmp_path / "root" / "sub-01" / "anat").mkdir(parents=True)
    result = run_cli("data", "check", str(tmp_path / "root"), cache=tmp_path / "cache")
    assert result.returncode == 1 and "sub-01: no sessions" in result.stderr


def test_gzip_fixture_really_is_truncated(dataset, tmp_path):
    root = copy_patient(dataset, tmp_path / "root")
    _corrupt_gzip(root)
    with pytest.raises(EOFError), gzip.open(root / layout.channel_image(SUB, "ses-01", "water")) as f:
        f.read()


def test_oblique_images_are_a_warning_not_an_error(dataset, tmp_path):
    root = copy_patient(dataset, tmp_path / "root")
    angle = np.radians(5)
    rotation = np.array(
        [
            [np.cos(angle), -np.sin(angle), 0, 0],
            [np.sin(angle), np.cos(angle), 0, 0],
            [0, 0, 1, 0],
            [0, 0, 0, 1],
        ]
    )
    for ses in ("ses-01", "ses-02"):
        for rel in [layout.channel_image(SUB, ses, c) for c in ("water", "fat", "in", "opp")] + [
            layout.organ_labels(SUB, ses),
            layout.lesion_labels(SUB, ses),
        ]:
            img = nib.load(root / rel)
            nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj), rotation @ img.affine), root / rel)
    result = run_cli("data", "check", str(root), cache=tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    assert "warning:" in result.stderr and "oblique image axes (5.0 degrees)" in result.stderr


def test_a_root_of_text_cases_alone_is_not_an_imaging_problem(tmp_path):
    """A root holding only clinic cases: data check and the server skip imaging (no "no subjects" problem);
    a root holding nothing any environment reads is refused by name."""
    from case_env.core import registry
    from case_env.settings import DataSettings

    root = tmp_path / "clinic-only"
    assert run_cli("synth", "--env", "clinic", "--out", str(root), cache=tmp_path / "c").returncode == 0
    checked = run_cli("data", "check", str(root), cache=tmp_path / "c")
    assert checked.returncode == 0, checked.stderr
    assert "clinic cases: 10" in checked.stdout and "subjects" not in checked.stdout + checked.stderr
    served = registry.get("imaging").open_cases(DataSettings(data_root=root, cache_dir=tmp_path / "c"))
    assert served.ids() == [] and not list(served.problems.shown())

    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a data root")
    checked = run_cli("data", "check", str(junk), cache=tmp_path / "c")
    assert checked.returncode == 1
    assert f"data root {junk} holds no data of any environment" in checked.stderr
