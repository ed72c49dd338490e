"""The patient data layer on generated data and on the real-data variants users bring."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from case_env.envs.imaging.data import layout
from case_env.envs.imaging.data.errors import (
    DataError,
    MissingDataError,
    UnknownPatientError,
    UnknownVisitError,
)
from case_env.envs.imaging.data.index import channel_of, scan
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.settings import ImagingSettings
from case_env.envs.imaging.tsv import read_tsv
from tests.conftest import image, organ_labels, subjects_by_scenario, tree_snapshot

SUB = "sub-0001"


def copy_patient(src: Path, dst: Path, sub: str = SUB) -> Path:
    """A data root holding one generated patient, for tests that alter files."""
    dst.mkdir(parents=True)
    for rel in (layout.PARTICIPANTS, layout.DATASET_DESCRIPTION, layout.LABEL_TABLE):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / rel, dst / rel)
    shutil.copytree(src / sub, dst / sub)
    for base in (layout.SEGMENTATIONS, layout.REPORTS):
        shutil.copytree(src / base / sub, dst / base / sub)
    participants = (dst / layout.PARTICIPANTS).read_text().splitlines()
    (dst / layout.PARTICIPANTS).write_text(
        "\n".join([participants[0], *[r for r in participants if r.startswith(sub)]]) + "\n"
    )
    return dst


def store_for(root: Path, tmp_path: Path, **kw) -> PatientStore:
    return PatientStore(settings=ImagingSettings(data_root=root, cache_dir=tmp_path / "cache", **kw))


def test_discovers_patients_and_visits(dataset, tmp_path):
    store = store_for(dataset, tmp_path)
    assert store.patient_ids() == [f"case{i:04d}" for i in range(1, 11)]
    patient = store.patient("case0001")
    assert patient.subject == SUB and [v.visit for v in patient.visits] == ["baseline", "follow_up"]
    follow = patient.visits[1]
    assert follow.session == "ses-02" and follow.interval_days > 600
    assert follow.acq_date > patient.visits[0].acq_date
    assert set(follow.channels) == {"water", "fat", "in", "opp"}
    assert not store.index.problems


def test_volumes_and_labels_load_native_and_ras(dataset, tmp_path):
    store = store_for(dataset, tmp_path)
    water = store.image("case0001", "baseline", "water")
    assert water.data.dtype == np.int16 and water.data.flags.f_contiguous and not water.data.flags.writeable
    assert water.original_axcodes == ("R", "A", "S")
    np.testing.assert_allclose(water.spacing, (4.464, 4.464, 6.0), rtol=1e-5)
    assert water.voxel_ml == pytest.approx(4.464 * 4.464 * 6.0 / 1000, rel=1e-5)
    assert np.array_equal(water.data, image(dataset, SUB, "ses-01", "water"))
    labels = store.organ_labels("case0001", "follow_up")
    assert labels.data.dtype == np.uint8
    assert np.array_equal(labels.data, organ_labels(dataset, SUB, "ses-02"))


def test_volumetry_comes_from_the_table(dataset, tmp_path):
    store = store_for(dataset, tmp_path)
    volumetry = store.volumetry("case0001", "baseline")
    table = {r["name"]: r for r in read_tsv(dataset / layout.organ_volumes(SUB, "ses-01"))}
    assert volumetry["liver"].volume_ml == float(table["liver"]["volume_ml"])
    assert volumetry["liver"].fat_fraction_pct == float(table["liver"]["mean_fatfraction_pct"])
    assert volumetry["right_kidney"].index == 5


def test_reports_lesions_and_manifest(dataset, tmp_path):
    store = store_for(dataset, tmp_path)
    sub = subjects_by_scenario(dataset)["new_liver_lesion"]
    pid = "case" + sub[4:]
    report = store.report(pid, "follow_up")
    assert report.markdown.startswith("# Body MRI report") and report.structured["visit"] == "follow_up"
    lesions = store.lesions(pid, "follow_up")
    assert lesions[1]["status"] == "new" and lesions[1]["organ_name"] == "liver"
    assert 1 not in store.lesions(pid, "baseline")
    assert store.manifest(pid, "follow_up")["scenario"]["name"] == "new_liver_lesion"
    stations = store.stations(pid, "baseline")
    assert len(stations) == 6 and stations[0][1] > stations[-1][1]


def test_lookups_fail_clearly(dataset, tmp_path):
    store = store_for(dataset, tmp_path)
    with pytest.raises(UnknownPatientError):
        store.patient("../../etc/passwd")
    with pytest.raises(UnknownVisitError, match="baseline, follow_up"):
        store.visit("case0001", "ses-01")


def test_cache_respects_its_budget_and_loads_once(dataset, tmp_path):
    one_visit = 5 * 112 * 87 * 185 * 2  # bytes of four int16 channels and more than the labels
    store = store_for(dataset, tmp_path, cache_bytes=one_visit)
    barrier = threading.Barrier(8)
    results = []

    def worker():
        barrier.wait()
        results.append(store.image("case0002", "baseline", "fat"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is results[0] for r in results)
    assert store.cache.stats().loads == 1
    for pid in ("case0001", "case0002", "case0003"):
        for visit in ("baseline", "follow_up"):
            for channel in ("water", "fat", "in", "opp"):
                store.image(pid, visit, channel)
    stats = store.cache.stats()
    assert stats.bytes <= one_visit and stats.evictions > 0


# -- real-data variants -----------------------------------------------------------------------------------


def _las(path_in: Path, path_out: Path) -> None:
    """The same image stored left-to-right (LAS), as dcm2niix often writes."""
    img = nib.load(path_in)
    data = np.asanyarray(img.dataobj)[::-1]
    affine = img.affine.copy()
    affine[:3, 3] += affine[:3, 0] * (data.shape[0] - 1)
    affine[:3, 0] *= -1
    out = nib.Nifti1Image(np.ascontiguousarray(data), affine)
    out.set_qform(affine, code=1)
    out.set_sform(affine, code=1)
    nib.save(out, path_out)


@pytest.fixture
def realistic_root(dataset, tmp_path) -> Path:
    """One patient the way a user might bring it: UK Biobank channel suffixes, .nii, LAS, no extras."""
    root = tmp_path / "real"
    for ses in ("ses-01", "ses-02"):
        anat = root / SUB / ses / "anat"
        anat.mkdir(parents=True)
        src = {c: dataset / layout.channel_image(SUB, ses, c) for c in ("water", "fat", "in", "opp")}
        shutil.copy(src["water"], anat / f"{SUB}_{ses}_dixon_W.nii.gz")
        nib.save(nib.load(src["fat"]), anat / f"{SUB}_{ses}_dixon_F.nii")  # uncompressed
        _las(src["in"], anat / f"{SUB}_{ses}_dixon_in.nii.gz")  # left-to-right
        _las(src["opp"], anat / f"{SUB}_{ses}_dixon_opp.nii")
        seg = root / layout.segmentation_dir(SUB, ses)
        seg.mkdir(parents=True)
        shutil.copy(dataset / layout.organ_labels(SUB, ses), seg / f"{SUB}_{ses}_desc-organs_dseg.nii.gz")
    return root


def test_real_data_variants_read_unchanged(dataset, realistic_root, tmp_path):
    store = store_for(realistic_root, tmp_path)
    assert [p.severity for p in store.index.problems] == []
    assert store.patient_ids() == [SUB]  # no participants.tsv: the subject label is the id
    for visit, ses in (("baseline", "ses-01"), ("follow_up", "ses-02")):
        for channel in ("water", "fat", "in", "opp"):
            loaded = store.image(SUB, visit, channel)
            assert np.array_equal(loaded.data, image(dataset, SUB, ses, channel)), (visit, channel)
            assert loaded.data.dtype == np.int16
    assert store.image(SUB, "baseline", "in").original_axcodes == ("L", "A", "S")
    np.testing.assert_allclose(
        store.image(SUB, "baseline", "in").affine, store.image(SUB, "baseline", "water").affine
    )
    # Optional files absent: clear answers, not errors.
    assert store.lesion_labels(SUB, "baseline") is None
    assert store.lesions(SUB, "baseline") == {}
    assert store.report(SUB, "baseline") is None
    assert store.manifest(SUB, "baseline") is None
    assert len(store.stations(SUB, "baseline")) == 6


def test_volumetry_without_a_table_is_computed_outside_the_data_tree(dataset, realistic_root, tmp_path):
    before = tree_snapshot(realistic_root)
    store = store_for(realistic_root, tmp_path)
    computed = store.volumetry(SUB, "follow_up")
    reference = {r["name"]: r for r in read_tsv(dataset / layout.organ_volumes(SUB, "ses-02"))}
    for organ in ("liver", "spleen", "left_kidney", "heart"):
        assert computed[organ].volume_ml == pytest.approx(
            float(reference[organ]["volume_ml"]), abs=2e-3
        )  # 3-decimal rounding
        assert computed[organ].voxels == int(reference[organ]["voxels"])
    assert computed["liver"].fat_fraction_pct is not None
    assert tree_snapshot(realistic_root) == before
    cached = list((tmp_path / "cache" / "volumetry").glob("*.tsv"))
    assert len(cached) == 1
    # A new store (a restarted server) reads the cached table instead of recomputing.
    again = store_for(realistic_root, tmp_path)
    assert again.volumetry(SUB, "follow_up")["liver"].volume_ml == computed["liver"].volume_ml
    assert again.cache.stats().loads == 0


def test_sessions_order_by_acquisition_date(dataset, tmp_path):
    root = tmp_path / "dates"
    shutil.copytree(dataset / SUB, root / SUB)
    # Relabel sessions so that label order and date order disagree.
    (root / SUB / "ses-01").rename(root / SUB / "ses-b")
    (root / SUB / "ses-02").rename(root / SUB / "ses-a")
    (root / layout.sessions_tsv(SUB)).write_text(
        "session_id\tacq_time\nses-b\t2015-01-02\nses-a\t2017-03-04\n"
    )
    index = scan(root)
    visits = index.patients[SUB].visits
    assert [v.session for v in visits] == ["ses-b", "ses-a"]
    assert visits[1].interval_days == 792


def test_label_maps_in_other_integer_dtypes_are_accepted(dataset, realistic_root, tmp_path):
    path = realistic_root / layout.segmentation_dir(SUB, "ses-01") / f"{SUB}_ses-01_desc-organs_dseg.nii.gz"
    img = nib.load(path)
    nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj).astype(np.int16), img.affine), path)
    store = store_for(realistic_root, tmp_path)
    labels = store.organ_labels(SUB, "baseline")
    assert labels.data.dtype == np.uint8
    assert np.array_equal(labels.data, organ_labels(dataset, SUB, "ses-01"))


def test_scaled_images_keep_native_dtype(dataset, tmp_path):
    path = tmp_path / "scaled.nii.gz"
    src = nib.load(dataset / layout.channel_image(SUB, "ses-01", "water"))
    img = nib.Nifti1Image(np.asanyarray(src.dataobj) // 2, src.affine)
    img.header.set_slope_inter(2.0, 0.0)
    nib.save(img, path)
    from case_env.envs.imaging.data.nifti import load_volume

    volume = load_volume(path)
    assert volume.data.dtype == np.int16 and volume.slope == 2.0 and volume.intercept == 0.0


def test_channel_names(tmp_path):
    assert channel_of("sub-1_ses-1_acq-dixon_rec-water_T1w.nii.gz") == "water"
    assert channel_of("sub-1_ses-1_acq-dixon_rec-opp_T1w.nii") == "opp"
    assert channel_of("x_W.nii.gz") == "water" and channel_of("x_F.nii") == "fat"
    assert channel_of("x_in.nii.gz") == "in" and channel_of("x_opp.nii.gz") == "opp"
    assert channel_of("x_IP.nii.gz") == "in" and channel_of("x_OP.nii.gz") == "opp"
    assert channel_of("x_T1w.nii.gz") is None


def test_a_missing_channel_is_reported_by_the_store(dataset, tmp_path):
    from tests.test_data_store import copy_patient

    root = copy_patient(dataset, tmp_path / "root")
    (root / layout.channel_image(SUB, "ses-02", "opp")).unlink()
    store = store_for(root, tmp_path)
    with pytest.raises(MissingDataError, match="not acquired"):
        store.image("case0001", "follow_up", "opp")
    assert store.image("case0001", "follow_up", "water").data.size > 0


def test_a_corrupt_volume_fails_for_that_file_only(dataset, tmp_path):
    root = copy_patient(dataset, tmp_path / "root")
    path = root / layout.channel_image(SUB, "ses-01", "fat")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    store = store_for(root, tmp_path)
    with pytest.raises(DataError, match="truncated or corrupt") as info:
        store.image("case0001", "baseline", "fat")
    assert info.value.path == str(layout.channel_image(SUB, "ses-01", "fat"))
    assert store.image("case0001", "baseline", "water").data.size > 0
    # A failed load is not cached: once the file is repaired it loads.
    shutil.copy(dataset / layout.channel_image(SUB, "ses-01", "fat"), path)
    assert store.image("case0001", "baseline", "fat").data.dtype == np.int16


def test_decoded_volumes_are_shared_through_the_disk_and_follow_file_changes(dataset, tmp_path):
    root = copy_patient(dataset, tmp_path / "root")
    first = store_for(root, tmp_path)
    water = first.image("case0001", "baseline", "water")
    decoded = sorted((tmp_path / "cache" / "decoded").glob("*.npy"))
    assert len(decoded) == 1
    # a second worker (another store on the same cache directory) maps the file instead of decoding
    second = store_for(root, tmp_path)
    mapped = second.image("case0001", "baseline", "water")
    assert isinstance(mapped.data.base, np.memmap) and not mapped.data.flags.writeable
    assert np.array_equal(mapped.data, water.data) and np.allclose(mapped.affine, water.affine)
    assert (mapped.slope, mapped.original_axcodes) == (water.slope, water.original_axcodes)
    # a damaged decoded file is decoded again, not served (written beside and renamed over: truncating a file
    # in place under live mappings would fault their readers, and the cache itself only ever renames)
    damaged = decoded[0].with_name("damaged")
    damaged.write_bytes(decoded[0].read_bytes()[:200])
    damaged.replace(decoded[0])
    third = store_for(root, tmp_path)
    assert np.array_equal(third.image("case0001", "baseline", "water").data, water.data)
    # a replaced source file gets its own decoded file
    path = first.visit("case0001", "baseline").channels["water"]
    img = nib.load(path)
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj)[::-1].copy(), img.affine, img.header), path)
    fourth = store_for(root, tmp_path, stat_ttl_s=0)
    assert not np.array_equal(fourth.image("case0001", "baseline", "water").data, water.data)
    assert len(list((tmp_path / "cache" / "decoded").glob("*.npy"))) == 2


def test_decoded_volumes_stay_within_their_disk_budget(dataset, tmp_path):
    store = store_for(dataset, tmp_path, decoded_bytes=12 * 2**20)
    for channel in ("water", "fat", "in", "opp"):
        store.image("case0001", "baseline", channel)
    sizes = [p.stat().st_size for p in (tmp_path / "cache" / "decoded").glob("*.npy")]
    assert 0 < sum(sizes) <= 12 * 2**20 and len(sizes) < 4


def test_unwritable_decoded_directory_falls_back_to_memory(dataset, tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "decoded").write_text("a file where the directory should be")
    store = store_for(dataset, tmp_path)
    water = store.image("case0001", "baseline", "water")
    assert not isinstance(water.data.base, np.memmap) and water.shape[0] > 0
