"""The synthetic generator: determinism, realistic sizes, ground truth that the images really show."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from case_env.envs.imaging.data import layout
from case_env.envs.imaging.data.volumetry import interior
from case_env.envs.imaging.synth.geometry import PROFILES, station_z_ranges
from case_env.envs.imaging.synth.norms import ADULT_RANGES_ML, MEASURED_ORGANS, SPLENOMEGALY_ML
from case_env.envs.imaging.synth.scenarios import SCENARIOS
from case_env.envs.imaging.synth.writer import generate_dataset, write_patient
from case_env.envs.imaging.tsv import read_tsv
from tests.conftest import (
    PATIENTS,
    SEED,
    image,
    lesion_labels,
    manifest,
    organ_labels,
    subjects_by_scenario,
)

SESSIONS = ("ses-01", "ses-02")
SOLID_ORGANS = MEASURED_ORGANS


def volumes(root: Path, sub: str, ses: str) -> dict[str, dict[str, str]]:
    return {r["name"]: r for r in read_tsv(root / layout.organ_volumes(sub, ses))}


def volume(root: Path, sub: str, ses: str, organ: str) -> float:
    return float(volumes(root, sub, ses)[organ]["volume_ml"])


def signal_fat_fraction(root: Path, sub: str, ses: str, label: int) -> float:
    """fat / (water + fat) over the organ's interior voxels, straight from the images."""
    labels = organ_labels(root, sub, ses)
    core = interior(labels) == label
    water = image(root, sub, ses, "water")[core].astype(float).sum()
    fat = image(root, sub, ses, "fat")[core].astype(float).sum()
    return 100 * fat / (water + fat)


def test_every_scenario_is_present(dataset):
    assert set(subjects_by_scenario(dataset)) == set(SCENARIOS)


def test_layout_is_complete(dataset):
    for sub in subjects_by_scenario(dataset).values():
        for ses in SESSIONS:
            for channel in ("water", "fat", "in", "opp"):
                assert (dataset / layout.channel_image(sub, ses, channel)).is_file()
            for path in (
                layout.organ_labels,
                layout.lesion_labels,
                layout.lesion_sidecar,
                layout.organ_volumes,
                layout.phantom_manifest,
            ):
                assert (dataset / path(sub, ses)).is_file(), path(sub, ses)
            assert (dataset / layout.report(sub, ses, "md")).is_file()
            assert (dataset / layout.report(sub, ses, "json")).is_file()
    for path in (layout.DATASET_DESCRIPTION, layout.PARTICIPANTS, layout.LABEL_TABLE):
        assert (dataset / path).is_file()


def test_images_are_int16_ras_on_the_profile_grid(dataset):
    import nibabel as nib

    sub = subjects_by_scenario(dataset)["stable_control"]
    img = nib.load(dataset / layout.channel_image(sub, "ses-01", "water"))
    assert img.get_data_dtype() == np.int16
    assert nib.aff2axcodes(img.affine) == ("R", "A", "S")
    assert img.shape == PROFILES["ci"].shape
    np.testing.assert_allclose(img.header.get_zooms()[:3], PROFILES["ci"].spacing, rtol=1e-5)
    labels = nib.load(dataset / layout.organ_labels(sub, "ses-01"))
    assert labels.get_data_dtype() == np.uint8
    np.testing.assert_allclose(labels.affine, img.affine)


def test_participants_and_sessions(dataset):
    rows = read_tsv(dataset / layout.PARTICIPANTS)
    assert [r["case_id"] for r in rows] == [f"case{i:04d}" for i in range(1, PATIENTS + 1)]
    assert [r["participant_id"] for r in rows] == [f"sub-{i:04d}" for i in range(1, PATIENTS + 1)]
    from datetime import date

    for row in rows:
        sessions = read_tsv(dataset / layout.sessions_tsv(row["participant_id"]))
        assert [s["session_id"] for s in sessions] == list(SESSIONS)
        d0, d1 = (date.fromisoformat(s["acq_time"]) for s in sessions)
        assert int(sessions[1]["interval_days"]) == (d1 - d0).days
        assert 600 <= (d1 - d0).days <= 1100  # about two years, as between UK Biobank instances 2 and 3
        assert int(sessions[0]["interval_days"]) == 0


def test_organ_volumes_are_adult_sized(dataset):
    scenario_of = {sub: name for name, sub in subjects_by_scenario(dataset).items()}
    for sub, scenario in scenario_of.items():
        for ses in SESSIONS:
            measured = volumes(dataset, sub, ses)
            for organ, (low, high) in ADULT_RANGES_ML.items():
                if organ == "spleen" and scenario == "splenomegaly" and ses == "ses-02":
                    continue
                value = float(measured[organ]["volume_ml"])
                assert low <= value <= high, (sub, ses, organ, value)


def test_measured_volumes_match_the_manifest(dataset):
    """Label-map volumes against the continuous phantom's volumes (integrated independently of the grid)."""
    worst = 0.0
    for sub in subjects_by_scenario(dataset).values():
        for ses in SESSIONS:
            truth = manifest(dataset, sub, ses)["true_volumes_ml"]
            for organ in SOLID_ORGANS:
                error = abs(volume(dataset, sub, ses, organ) / truth[organ] - 1)
                worst = max(worst, error)
                assert error < 0.03, (sub, ses, organ, volume(dataset, sub, ses, organ), truth[organ])
    assert worst > 0  # the two numbers come from different computations


@pytest.fixture(scope="module")
def full_profile_patient(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("full")
    write_patient(root, SEED, 0, "full")
    return root


def test_profiles_agree(dataset, full_profile_patient):
    # The issue asks for 2 %; the volume-preserving downsampling gives well under 0.5 %.
    for ses in SESSIONS:
        for organ in SOLID_ORGANS:
            ci = volume(dataset, "sub-0001", ses, organ)
            full = volume(full_profile_patient, "sub-0001", ses, organ)
            assert abs(ci / full - 1) < 0.005, (ses, organ, ci, full)
    import nibabel as nib

    img = nib.load(full_profile_patient / layout.channel_image("sub-0001", "ses-01", "water"))
    assert img.shape == (224, 174, 370)
    np.testing.assert_allclose(img.header.get_zooms()[:3], (2.232, 2.232, 3.0), rtol=1e-5)


def test_manifests_do_not_depend_on_the_profile(dataset, full_profile_patient):
    for ses in SESSIONS:
        ci = manifest(dataset, "sub-0001", ses)
        full = manifest(full_profile_patient, "sub-0001", ses)
        assert ci.pop("generator")["profile"] == "ci"
        assert full.pop("generator")["profile"] == "full"
        assert ci == full


def test_generation_is_deterministic(dataset, tmp_path):
    again = tmp_path / "again"
    generate_dataset(again, 2, "ci", SEED, jobs=1)
    for sub in ("sub-0001", "sub-0002"):
        for ses in SESSIONS:
            for rel in (
                layout.phantom_manifest(sub, ses),
                layout.organ_volumes(sub, ses),
                layout.lesion_sidecar(sub, ses),
                layout.report(sub, ses, "md"),
                layout.report(sub, ses, "json"),
            ):
                assert (again / rel).read_bytes() == (dataset / rel).read_bytes(), rel
            for channel in ("water", "fat", "in", "opp"):
                assert np.array_equal(image(again, sub, ses, channel), image(dataset, sub, ses, channel))
            assert np.array_equal(organ_labels(again, sub, ses), organ_labels(dataset, sub, ses))
            assert np.array_equal(lesion_labels(again, sub, ses), lesion_labels(dataset, sub, ses))
        rel = layout.sessions_tsv(sub)
        assert (again / rel).read_bytes() == (dataset / rel).read_bytes()
    assert (again / layout.LABEL_TABLE).read_bytes() == (dataset / layout.LABEL_TABLE).read_bytes()


def test_a_different_seed_gives_different_patients(tmp_path):
    from case_env.envs.imaging.synth.patient import plan_patient

    a, b = plan_patient(SEED, 0), plan_patient(SEED + 1, 0)
    assert a.anatomy != b.anatomy


# -- each scenario's change is in the label maps and the images -----------------------------------------


def _changes(dataset, sub) -> dict[str, float]:
    before, after = volumes(dataset, sub, "ses-01"), volumes(dataset, sub, "ses-02")
    return {o: float(after[o]["volume_ml"]) / float(before[o]["volume_ml"]) - 1 for o in SOLID_ORGANS}


def test_stable_control_changes_within_measurement_noise(dataset):
    sub = subjects_by_scenario(dataset)["stable_control"]
    for organ, change in _changes(dataset, sub).items():
        if organ != "bladder":  # filling differs between visits
            assert abs(change) < 0.03, (organ, change)
    assert manifest(dataset, sub, "ses-02")["scenario"]["icd10"] == []
    assert not [
        les for les in manifest(dataset, sub, "ses-02")["visit_state"]["lesions"] if not les["incidental"]
    ]


def test_new_liver_lesion_exists_only_at_follow_up(dataset):
    sub = subjects_by_scenario(dataset)["new_liver_lesion"]
    base, follow = lesion_labels(dataset, sub, "ses-01"), lesion_labels(dataset, sub, "ses-02")
    assert np.count_nonzero(base == 1) == 0
    assert np.count_nonzero(follow == 1) > 0
    # Inside the liver, and visible: lesion tissue differs from liver parenchyma on the water image.
    organs = organ_labels(dataset, sub, "ses-02")
    assert np.all(organs[follow == 1] == 1)
    water = image(dataset, sub, "ses-02", "water").astype(float)
    lesion_core = interior(follow) == 1
    parenchyma = (interior(organs) == 1) & (follow == 0)
    assert water[lesion_core].mean() < 0.8 * water[parenchyma].mean()
    man = manifest(dataset, sub, "ses-02")
    lesion = man["visit_state"]["lesions"][0]
    assert lesion["status"] == "new" and 10 <= lesion["diameter_mm"] <= 25
    assert man["scenario"]["icd10"][0]["code"] in ("C78.7", "K76.8")
    report = json.loads((dataset / layout.report(sub, "ses-02", "json")).read_text())
    assert any(e["status"] == "new" and e["organ"] == "liver" for e in report["lesions"])
    baseline_report = json.loads((dataset / layout.report(sub, "ses-01", "json")).read_text())
    assert not any(e["organ"] == "liver" and not e["incidental"] for e in baseline_report["lesions"])


def test_growing_liver_lesion_grows_by_recist_progression(dataset):
    sub = subjects_by_scenario(dataset)["growing_liver_lesion"]
    lesion0 = manifest(dataset, sub, "ses-01")["visit_state"]["lesions"][0]
    lesion1 = manifest(dataset, sub, "ses-02")["visit_state"]["lesions"][0]
    d0, d1 = lesion0["diameter_mm"], lesion1["diameter_mm"]
    assert d1 >= 1.2 * d0 and d1 - d0 >= 5
    assert lesion1["status"] == "enlarging" and lesion1["centre_mm"] == lesion0["centre_mm"]
    v0 = np.count_nonzero(lesion_labels(dataset, sub, "ses-01") == 1)
    v1 = np.count_nonzero(lesion_labels(dataset, sub, "ses-02") == 1)
    assert v0 > 0
    assert v1 / v0 == pytest.approx((d1 / d0) ** 3, rel=0.35)


def test_renal_cyst_appears_or_grows_in_its_kidney(dataset):
    sub = subjects_by_scenario(dataset)["renal_cyst"]
    man = manifest(dataset, sub, "ses-02")
    lesion = next(les for les in man["visit_state"]["lesions"] if not les["incidental"])
    host = 14 if lesion["organ"] == "left_kidney" else 5
    follow = lesion_labels(dataset, sub, "ses-02") == lesion["instance"]
    base = lesion_labels(dataset, sub, "ses-01") == lesion["instance"]
    assert np.all(organ_labels(dataset, sub, "ses-02")[follow] == host)
    assert np.count_nonzero(follow) > np.count_nonzero(base)
    # A simple cyst is fluid: darker than kidney parenchyma on the in-phase image.
    in_phase = image(dataset, sub, "ses-02", "in").astype(float)
    parenchyma = (interior(organ_labels(dataset, sub, "ses-02")) == host) & ~follow
    assert in_phase[interior(follow.astype(np.uint8)) == 1].mean() < 0.6 * in_phase[parenchyma].mean()
    assert man["scenario"]["icd10"][0]["code"] == "N28.1"


@pytest.mark.parametrize(
    ("scenario", "direction"), [("steatosis_progression", 1), ("steatosis_regression", -1)]
)
def test_liver_fat_changes_in_the_fat_and_water_signal(dataset, scenario, direction):
    sub = subjects_by_scenario(dataset)[scenario]
    ff0 = signal_fat_fraction(dataset, sub, "ses-01", 1)
    ff1 = signal_fat_fraction(dataset, sub, "ses-02", 1)
    assert direction * (ff1 - ff0) > 5, (ff0, ff1)
    truth0 = manifest(dataset, sub, "ses-01")["true_fat_fraction_pct"]["liver"]
    truth1 = manifest(dataset, sub, "ses-02")["true_fat_fraction_pct"]["liver"]
    assert direction * (truth1 - truth0) > 5
    # The tabulated (noise-corrected) fat fraction tracks the truth within 1.5 points.
    for ses, truth in (("ses-01", truth0), ("ses-02", truth1)):
        tabulated = float(volumes(dataset, sub, ses)["liver"]["mean_fatfraction_pct"])
        assert abs(tabulated - truth) < 1.5, (ses, tabulated, truth)
    assert manifest(dataset, sub, "ses-02")["scenario"]["icd10"][0]["code"] == "K76.0"


def test_splenomegaly_develops(dataset):
    sub = subjects_by_scenario(dataset)["splenomegaly"]
    change = _changes(dataset, sub)
    assert change["spleen"] > 0.9
    assert volume(dataset, sub, "ses-02", "spleen") > SPLENOMEGALY_ML
    assert volume(dataset, sub, "ses-01", "spleen") < SPLENOMEGALY_ML
    assert all(abs(c) < 0.03 for o, c in change.items() if o not in ("spleen", "bladder"))


def test_pancreatic_fatty_atrophy(dataset):
    sub = subjects_by_scenario(dataset)["pancreatic_fatty_atrophy"]
    assert -0.14 < _changes(dataset, sub)["pancreas"] < -0.06
    assert signal_fat_fraction(dataset, sub, "ses-02", 4) > signal_fat_fraction(dataset, sub, "ses-01", 4) + 3


def test_sarcopenia_shrinks_the_muscles(dataset):
    sub = subjects_by_scenario(dataset)["sarcopenia"]
    change = _changes(dataset, sub)
    for muscle in ("left_iliopsoas", "right_iliopsoas", "left_gluteus_maximus", "right_autochthon"):
        assert -0.12 < change[muscle] < -0.04, (muscle, change[muscle])
    assert abs(change["liver"]) < 0.03


def test_fat_water_swap_is_an_artefact_without_true_change(dataset):
    sub = subjects_by_scenario(dataset)["fat_water_swap"]
    man = manifest(dataset, sub, "ses-02")
    station = man["artefacts"][0]["station"]
    assert man["artefacts"][0]["type"] == "fat_water_swap" and man["scenario"]["icd10"] == []
    for organ, change in _changes(dataset, sub).items():
        if organ != "bladder":
            assert abs(change) < 0.03
    grid = PROFILES["ci"]
    low, high = station_z_ranges()[station - 1]
    z = grid.axis(2)
    inside = (z > low + 10) & (z < high - 10)
    outside = (z < low - 10) | (z > high + 10)
    # Subcutaneous fat: fat-dominant on the fat image at baseline, on the water image where swapped.
    labels = organ_labels(dataset, sub, "ses-02")
    body = image(dataset, sub, "ses-02", "in") > 600
    fatty = body & (labels == 0)
    w1, f1 = image(dataset, sub, "ses-02", "water"), image(dataset, sub, "ses-02", "fat")
    assert w1[:, :, inside][fatty[:, :, inside]].mean() > 2 * f1[:, :, inside][fatty[:, :, inside]].mean()
    assert f1[:, :, outside][fatty[:, :, outside]].mean() > 2 * w1[:, :, outside][fatty[:, :, outside]].mean()
    # In-phase is unaffected by the swap.
    ip0, ip1 = image(dataset, sub, "ses-01", "in"), image(dataset, sub, "ses-02", "in")
    assert abs(ip1[:, :, inside].mean() / ip0[:, :, inside].mean() - 1) < 0.08
    report = json.loads((dataset / layout.report(sub, "ses-02", "json")).read_text())
    assert f"station {station}" in report["image_quality"]


def test_reports_quote_the_measured_volumes_and_carry_incidentals(dataset):
    for sub in subjects_by_scenario(dataset).values():
        for ses in SESSIONS:
            report = json.loads((dataset / layout.report(sub, ses, "json")).read_text())
            md = (dataset / layout.report(sub, ses, "md")).read_text()
            measured = volumes(dataset, sub, ses)
            liver = next(f for f in report["findings"] if f["organ"] == "liver")
            assert liver["volume_ml"] == pytest.approx(float(measured["liver"]["volume_ml"]), abs=0.05)
            assert f"{float(measured['liver']['volume_ml']):,.0f} mL" in md
            assert report["impression"] and report["incidental"]
            assert "## Impression" in md and report["technique"] in md
            if ses == "ses-02":
                assert report["comparison"]["session"] == "ses-01"
                assert "Compared with ses-01" in md
            else:
                assert report["comparison"] is None
            # Reports are not answer keys: findings in words, never the diagnosis codes.
            for code in manifest(dataset, sub, ses)["scenario"]["icd10"]:
                assert code["code"] not in md


def test_lesion_instance_ids_are_stable_across_visits(dataset):
    for sub in subjects_by_scenario(dataset).values():
        before = {les["instance"]: les for les in manifest(dataset, sub, "ses-01")["visit_state"]["lesions"]}
        after = {les["instance"]: les for les in manifest(dataset, sub, "ses-02")["visit_state"]["lesions"]}
        for instance in before.keys() & after.keys():
            assert before[instance]["centre_mm"] == after[instance]["centre_mm"]
            assert before[instance]["organ"] == after[instance]["organ"]
        sidecar = json.loads((dataset / layout.lesion_sidecar(sub, "ses-02")).read_text())
        assert set(map(int, sidecar)) == set(after)
