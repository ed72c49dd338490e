"""UK Biobank field-20201 zips, end to end on a machine without UK Biobank access: the synthetic patients
written as the zips a download holds (real DICOM through pydicom), ingested back into the data layout, with
the voxels, geometry and organ volumes checked against the NIfTI they came from; bad zips one by one."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest

from case_env.envs.imaging.data import layout
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.scan_protocol import CHANNELS
from case_env.envs.imaging.synth.writer import generate_dataset
from case_env.envs.imaging.tsv import read_tsv
from case_env.envs.imaging.ukb.ingest import ingest
from case_env.envs.imaging.ukb.stations import GeometryError, Station, split, stitch
from case_env.envs.imaging.ukb.synthetic import OVERLAP, write_ukb_zips
from tests.conftest import SEED, tree_snapshot


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "case_env.cli", *args], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ukb-source") / "root"
    generate_dataset(root, 2, "ci", SEED, jobs=2)
    return root


@pytest.fixture(scope="module")
def zips(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ukb-zips") / "zips"
    write_ukb_zips(source, out, SEED, lambda _line: None)
    return out


@pytest.fixture(scope="module")
def ingested(zips, tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("ukb-root") / "root"
    return out, ingest(zips, out, jobs=2)


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_synthetic_download_has_the_uk_biobank_shape(zips):
    names = sorted(p.name for p in zips.iterdir())
    assert names == [
        "9000001_20201_2_0.zip",
        "9000001_20201_3_0.zip",
        "9000002_20201_2_0.zip",
        "9000002_20201_3_0.zip",
    ]
    with zipfile.ZipFile(zips / names[0]) as zf:
        headers = [pydicom.dcmread(io.BytesIO(zf.read(n)), stop_before_pixels=True) for n in zf.namelist()]
    series = {h.SeriesInstanceUID: h for h in headers}
    assert len(series) == 24
    descriptions = sorted({h.SeriesDescription for h in series.values()})
    assert descriptions == sorted(
        f"Dixon_{hold}_{c}" for hold in ("noBH", "BH_17s") for c in ("F", "W", "in", "opp")
    )
    assert {h.PatientID for h in headers} == {"9000001"} and {h.StudyDate for h in headers} == {
        headers[0].StudyDate
    }
    rows = {int(h.Rows) for h in series.values()}
    assert len(rows) > 1  # the neck and thigh stations lost their empty rows, as UK Biobank stations differ


def test_ingest_reproduces_the_synthetic_volumes(source, ingested):
    out, summary = ingested
    assert summary.count("written") == 4 and not summary.problems
    participants = {r["eid"]: r for r in read_tsv(out / "participants.tsv")}
    theirs = {r["eid"]: r for r in read_tsv(source / "participants.tsv")}
    assert set(participants) == set(theirs) == {"9000001", "9000002"}
    for eid, row in participants.items():
        src_sub, sub = theirs[eid]["participant_id"], row["participant_id"]
        assert sub == f"sub-{eid}" and row["sex"] == theirs[eid]["sex"] and row["age"] == theirs[eid]["age"]
        sessions = read_tsv(out / layout.sessions_tsv(sub))
        expected = read_tsv(source / layout.sessions_tsv(src_sub))
        assert [
            (s["session_id"], s["acq_time"], s["ukb_instance"], s["interval_days"]) for s in sessions
        ] == [(s["session_id"], s["acq_time"], s["ukb_instance"], s["interval_days"]) for s in expected]
        for ses in ("ses-01", "ses-02"):
            for channel in CHANNELS:
                a = nib.load(source / layout.channel_image(src_sub, ses, channel))
                b = nib.load(out / layout.channel_image(sub, ses, channel))
                assert b.shape == a.shape and np.allclose(b.affine, a.affine, atol=1e-3)
                # stations at the volume's own slice spacing, identical in their overlaps: no tolerance
                assert np.array_equal(np.asanyarray(b.dataobj), np.asanyarray(a.dataobj)), (sub, ses, channel)
            visit = "baseline" if ses == "ses-01" else "follow_up"
            sidecar = PatientStore(out).sidecar(row["case_id"], visit, "water")
            assert sidecar["Stations"] == 6 and len(sidecar["StationBoundariesMm"]) == 6
            assert sidecar["UKBiobankField"] == 20201 and sidecar["SourceFile"].startswith(eid)


def test_organ_volumes_survive_the_station_geometry(source, zips):
    """The label map carried through the zips' stations (nearest slice) and stitched again: every
    organ's volume within 1 % of the original's."""
    store = PatientStore(source)
    for pid in store.patient_ids():
        for visit in ("baseline", "follow_up"):
            labels = store.organ_labels(pid, visit)
            stations = split(np.asarray(labels.data), labels.affine, store.stations(pid, visit), OVERLAP)
            stitched = stitch(stations, order=0)
            back = np.asanyarray(
                nib.as_closest_canonical(nib.Nifti1Image(stitched.data, stitched.affine_ras)).dataobj
            )
            before = np.bincount(labels.data.ravel(), minlength=256)
            after = np.bincount(back.ravel(), minlength=256)
            present = np.nonzero(before[1:])[0] + 1
            assert np.all(np.abs(after[present] - before[present]) <= 0.01 * before[present])


def test_a_second_run_skips_every_visit_and_the_output_is_deterministic(zips, ingested, tmp_path):
    out, _ = ingested
    digest = _digest(out)
    again = ingest(zips, out, jobs=1)
    assert again.count("skipped") == 4 and again.count("written") == 0
    assert _digest(out) == digest
    fresh = tmp_path / "fresh"
    ingest(zips, fresh, jobs=1)
    assert _digest(fresh) == digest


def test_the_ingested_root_serves_the_same_measurements(source, ingested):
    out, _ = ingested
    result = cli("segment", str(out), "--copy-derivatives-from", str(source))
    assert result.returncode == 0, result.stderr
    check = cli("data", "check", str(out))
    assert check.returncode == 0, check.stdout + check.stderr
    theirs, ours = PatientStore(source), PatientStore(out)
    for pid in theirs.patient_ids():
        for visit in ("baseline", "follow_up"):
            a, b = theirs.volumetry(pid, visit), ours.volumetry(pid, visit)
            assert {o: round(m.volume_ml, 1) for o, m in a.items()} == {
                o: round(m.volume_ml, 1) for o, m in b.items()
            }


def _ramp_stations(spacings: list[int]) -> tuple[np.ndarray, list[Station]]:
    """A linear ramp along z cut into stations, some of them keeping only every n-th slice."""
    volume = np.broadcast_to((np.arange(60) * 10).astype(np.int16), (4, 3, 60)).copy()
    affine = np.diag([2.0, 2.0, 3.0, 1.0])  # slices at z = 0, 3, ..., 177 mm
    stations = split(volume, affine, [(120.0, 180.0), (60.0, 120.0), (0.0, 60.0)], 4)
    for station, every in zip(stations, spacings, strict=True):
        if every > 1:
            station.data = station.data[:, :, ::every]
            station.positions = station.positions[::every]
    return volume, stations


def test_a_station_at_another_slice_spacing_is_resampled_linearly():
    volume, stations = _ramp_stations([1, 2, 1])
    stitched = stitch(stations, order=1, slice_mm=3.0)
    back = np.asanyarray(
        nib.as_closest_canonical(nib.Nifti1Image(stitched.data, stitched.affine_ras)).dataobj
    )
    assert back.shape == volume.shape
    # linear interpolation of a linear ramp is exact; only the ends a coarse station cannot reach differ
    assert np.abs(back.astype(int) - volume).max() <= 10
    assert (back == volume).mean() > 0.95


def test_stations_that_disagree_are_named():
    _, stations = _ramp_stations([1, 1, 1])
    stations[1].row_dir = np.array([0.0, 1.0, 0.0])
    stations[1].col_dir = np.array([1.0, 0.0, 0.0])
    with pytest.raises(GeometryError, match="station 2: orientation"):
        stitch(stations)
    _, stations = _ramp_stations([1, 1, 1])
    stations[2].spacing = (2.5, 2.0)
    with pytest.raises(GeometryError, match="station 3: pixel spacing"):
        stitch(stations)
    _, stations = _ramp_stations([1, 1, 1])
    stations[1].data, stations[1].positions = stations[1].data[:, :, 8:-8], stations[1].positions[8:-8]
    with pytest.raises(GeometryError, match="no station covers"):
        stitch(stations)


def _rewrite(src: Path, dst: Path, change) -> None:
    """A copy of a zip for the participant its new name says, with `change(dataset)` applied to every
    DICOM (returning False drops the file)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            ds = pydicom.dcmread(io.BytesIO(zin.read(name)))
            ds.PatientID = dst.name.split("_")[0]
            if change(ds) is False:
                continue
            buffer = io.BytesIO()
            ds.save_as(buffer)
            zout.writestr(name, buffer.getvalue())


def test_bad_zips_are_reported_one_by_one_and_nothing_else_is_lost(zips, tmp_path):
    bad = tmp_path / "download"
    bad.mkdir()
    good = zips / "9000001_20201_2_0.zip"
    (bad / "9000001_20201_2_0.zip").write_bytes(good.read_bytes())  # the one good visit
    (bad / "1000001_20201_2_0.zip").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (bad / "1000002_20201_2_0.zip").write_text("this is not a zip")
    with zipfile.ZipFile(good) as zf:
        first_series = pydicom.dcmread(io.BytesIO(zf.read(zf.namelist()[0]))).SeriesInstanceUID
    _rewrite(good, bad / "1000003_20201_2_0.zip", lambda ds: ds.SeriesInstanceUID != first_series)

    def rotate(ds):
        if ds.SeriesNumber == 5:
            ds.ImageOrientationPatient = [0, 1, 0, 1, 0, 0]

    _rewrite(good, bad / "1000004_20201_2_0.zip", rotate)

    def respace(ds):
        if ds.SeriesNumber == 9:
            ds.PixelSpacing = [2.0, 2.0]

    _rewrite(good, bad / "1000005_20201_2_0.zip", respace)

    def other_field(ds):
        if ds.SeriesNumber == 1:
            ds.SeriesDescription = "ShMOLLI_192i_SAX"

    _rewrite(good, bad / "1000006_20201_2_0.zip", other_field)
    (bad / "1000007_20204_2_0.zip").write_bytes(good.read_bytes())
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad / "1000008_20201_2_0.zip", "w") as junk:
        for name in zin.namelist():
            junk.writestr(name, zin.read(name))
        junk.writestr("notes.bin", b"not an image" * 20)
    # DICOM files without the 128-byte preamble and "DICM" (as some exporters write them) still read
    _rewrite(good, bad / "1000009_20201_2_0.zip", lambda ds: None)
    with zipfile.ZipFile(bad / "1000009_20201_2_0.zip") as zin:
        members = {name: zin.read(name)[132:] for name in zin.namelist()}
    with zipfile.ZipFile(bad / "1000009_20201_2_0.zip", "w") as zout:
        for name, raw in members.items():
            zout.writestr(name, raw)
    before = tree_snapshot(bad)
    out = tmp_path / "root"
    result = cli("ingest", "ukb", "--zips", str(bad), "--out", str(out), "--jobs", "2", "--no-progress")
    text = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in text
    assert "1000001_20201_2_0.zip: not a readable zip file (truncated or not a zip" in text
    assert "1000002_20201_2_0.zip: not a readable zip file" in text
    assert (
        "1000003_20201_2_0.zip: 23 series, expected 24 (6 stations x 4 channels); stations per channel:"
        in text
    )
    assert "1000004_20201_2_0.zip channel" in text and "orientation" in text
    assert "1000005_20201_2_0.zip channel" in text and "pixel spacing" in text
    assert "SeriesDescription 'ShMOLLI_192i_SAX' is not a Dixon series" in text
    assert "1000007_20204_2_0.zip: field 20204, not 20201" in text
    assert "1000008_20201_2_0.zip:notes.bin: not a DICOM file" in text
    assert "2 visits written" in result.stdout and "7 failed" in result.stdout
    assert tree_snapshot(bad) == before  # nothing written into the input
    assert (out / layout.channel_image("sub-9000001", "ses-01", "water")).exists()
    assert [r["eid"] for r in read_tsv(out / "participants.tsv")] == ["1000009", "9000001"]
    inside = cli("ingest", "ukb", "--zips", str(bad), "--out", str(bad / "root"))
    assert inside.returncode == 2 and "never written to" in inside.stderr


FAKE_ENGINE = '''
"""A stand-in for TotalSegmentator's python_api: the model cannot run here, so its output is scripted.
It answers with the source root's label map in total_mr numbering, as `TotalSegmentator --ml` writes."""
import os
from pathlib import Path

import nibabel as nib
import numpy as np

from case_env.envs.imaging.labels import _TOTAL_MR
from case_env.envs.imaging.ukb.segment import TOTAL_MR_2_18

CALLS = []


def totalsegmentator(input, output, ml=False, task="total", device="gpu", quiet=False):
    CALLS.append((str(input), task, ml, device))
    assert task == "total_mr" and ml
    name = Path(input).name.replace("_rec-in_T1w.nii.gz", "_desc-organs_dseg.nii.gz")
    sub, ses = name.split("_")[:2]
    truth = nib.load(Path(os.environ["FAKE_TS_TRUTH"]) / sub / ses / "anat" / name)
    number = {v: k for k, v in TOTAL_MR_2_18.items()}
    lut = np.zeros(256, dtype=np.uint8)
    for vista, ts_name in _TOTAL_MR.items():
        lut[vista] = number.get(ts_name, 0)
    nib.save(nib.Nifti1Image(lut[np.asanyarray(truth.dataobj)], truth.affine), str(output))
'''


def test_segment_writes_vista3d_label_maps_from_total_mr_output(source, tmp_path, monkeypatch):
    from case_env.envs.imaging.labels import _TOTAL_MR
    from case_env.envs.imaging.ukb.segment import LUNG, segment_root

    root = tmp_path / "root"
    shutil.copytree(source, root)
    truth = tmp_path / "truth"
    shutil.copytree(root / layout.SEGMENTATIONS, truth)
    for path in (root / layout.SEGMENTATIONS).rglob("*desc-organs_*"):
        path.unlink()
    package = tmp_path / "engine" / "totalsegmentator"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "python_api.py").write_text(FAKE_ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path / "engine"))
    monkeypatch.setenv("FAKE_TS_TRUTH", str(truth))
    for name in [m for m in sys.modules if m.startswith("totalsegmentator")]:
        monkeypatch.delitem(sys.modules, name)
    lines = segment_root(root)
    assert len(lines) == 4 and all("left out (no VISTA3D id): vertebrae" in line for line in lines), lines
    from totalsegmentator.python_api import CALLS

    assert len(CALLS) == 4 and all(c[1:] == ("total_mr", True, "cpu") for c in CALLS)
    assert all(c[0].endswith("_rec-in_T1w.nii.gz") for c in CALLS)
    store = PatientStore(root)
    for pid in store.patient_ids():
        sub = store.patient(pid).subject
        for ses in ("ses-01", "ses-02"):
            original = np.asanyarray(
                nib.load(
                    truth / sub / ses / "anat" / f"{sub}_{ses}_acq-dixon_desc-organs_dseg.nii.gz"
                ).dataobj
            )
            written = np.asanyarray(nib.load(root / layout.organ_labels(sub, ses)).dataobj)
            direct = np.isin(
                original,
                [i for i, n in _TOTAL_MR.items() if n not in ("vertebrae", "lung_left", "lung_right")],
            )
            assert np.array_equal(written[direct], original[direct])
            lungs = np.isin(original, [28, 29, 30, 31, 32])
            assert lungs.any() and (written[lungs] == LUNG).all()
            assert (written[(original >= 33) & (original <= 56)] == 0).all()  # levels: not in total_mr
            assert (root / layout.organ_volumes(sub, ses)).exists()
    again = segment_root(root)
    assert again == [f"{root}: every visit has an organ label map (--force to replace them)"]
    liver = {pid: store.volumetry(pid, "baseline")["liver"].volume_ml for pid in store.patient_ids()}
    theirs = PatientStore(source)
    assert liver == {
        pid: theirs.volumetry(pid, "baseline")["liver"].volume_ml for pid in theirs.patient_ids()
    }


def test_segment_without_the_engine_says_what_to_install(source, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(source, root)
    for path in (root / layout.SEGMENTATIONS).rglob("*desc-organs_dseg.nii.gz"):
        path.unlink()
    result = cli("segment", str(root))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: organ segmentation needs TotalSegmentator: pip install 'case-env[segment]' (brings torch and "
        "nnunetv2); its total_mr weights download on first use, or put them under TOTALSEG_HOME_DIR"
    ]


def test_an_engine_without_its_weights_fails_in_one_line(source, tmp_path, monkeypatch):
    from case_env.envs.imaging.ukb.segment import SegmentError, segment_root

    root = tmp_path / "root"
    shutil.copytree(source, root)
    for path in (root / layout.SEGMENTATIONS).rglob("*desc-organs_dseg.nii.gz"):
        path.unlink()

    def offline(image, output, device):
        raise ConnectionError("cannot download the total_mr weights")

    with pytest.raises(SegmentError) as failure:
        segment_root(root, engine=offline)
    message = str(failure.value)
    assert "\n" not in message and message.startswith("TotalSegmentator failed on case0001 baseline")
    assert "cannot download the total_mr weights" in message and "TOTALSEG_HOME_DIR" in message
    assert not list((root / layout.SEGMENTATIONS).rglob("*desc-organs_dseg.nii.gz"))


def test_ingest_without_pydicom_says_what_to_install(zips, tmp_path, monkeypatch):
    from case_env.envs.imaging.ukb.dicom import ZipError

    monkeypatch.setitem(sys.modules, "pydicom", None)  # as if the `ukb` extra were not installed
    with pytest.raises(ZipError, match=r"needs pydicom: pip install 'case-env\[ukb\]'"):
        ingest(zips, tmp_path / "root")
    assert not (tmp_path / "root").exists()
