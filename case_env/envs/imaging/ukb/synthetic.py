"""`case-env synth --format ukb-dicom`: the synthetic patients as the zips a UK Biobank download holds.

Each visit of a synthetic NIfTI root becomes `<eid>_20201_<instance>_0.zip`: 24 series of axial DICOM
slices (six stations by four channels), stations cut at the generator's station boundaries and reaching
`OVERLAP` slices into the station below, the neck and thigh stations without their empty anterior and
posterior rows (as UK Biobank stations differ in their row count), UK Biobank-style series descriptions,
and the tags the ingest reads. Stations keep the volume's slice spacing, so ingesting the zips gives the
NIfTI volumes back voxel for voxel.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np

from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.scan_protocol import CHANNELS
from case_env.envs.imaging.synth.clinical import synthetic_eid
from case_env.envs.imaging.tsv import read_tsv
from case_env.envs.imaging.ukb import protocol
from case_env.envs.imaging.ukb.dicom import write_zip
from case_env.envs.imaging.ukb.stations import split

OVERLAP = 4  # slices shared by neighbouring stations
MAX_CROP = 3  # empty rows dropped at each side of the neck and thigh stations


def _empty_rows(volumes: list[np.ndarray], z: slice) -> tuple[int, int]:
    """(anterior, posterior) rows, up to MAX_CROP each, that are zero in every channel of a station; in
    the scanner's frame rows run anterior to posterior, the reverse of RAS y."""
    used = np.zeros(volumes[0].shape[1], dtype=bool)
    for v in volumes:
        used |= (v[:, :, z] != 0).any(axis=(0, 2))
    rows = used[::-1]
    top = int(np.argmax(rows)) if rows.any() else 0
    bottom = int(np.argmax(rows[::-1])) if rows.any() else 0
    return min(top, MAX_CROP), min(bottom, MAX_CROP)


def write_ukb_zips(
    source: Path, out: Path, seed: int, echo: Callable[[str], object], force: bool = False
) -> list[Path]:
    """Zips of every visit of a synthetic root (a zip already there is kept unless `force`); returns
    their paths."""
    store = PatientStore(source)
    participants = {row["participant_id"]: row for row in read_tsv(source / "participants.tsv")}
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for pid in store.patient_ids():
        patient = store.patient(pid)
        row = participants.get(patient.subject, {})
        eid = row.get("eid") or synthetic_eid(int(patient.subject.split("-")[1]) - 1)
        sessions = {
            r["session_id"]: r for r in read_tsv(source / patient.subject / f"{patient.subject}_sessions.tsv")
        }
        for vf in patient.visits:
            instance = int(
                sessions.get(vf.session, {}).get("ukb_instance") or (2 if vf.visit == "baseline" else 3)
            )
            path = out / protocol.BulkFile(eid, protocol.FIELD, instance, 0).name()
            if path.exists() and not force:
                written.append(path)
                echo(f"  {path.name}: kept ({pid} {vf.visit}; --force rewrites it)")
                continue
            volumes = {c: store.image(pid, vf.visit, c) for c in CHANNELS}
            bounds = store.stations(pid, vf.visit)
            arrays = [v.data for v in volumes.values()]
            z = volumes["water"].affine[2, 3] + volumes["water"].affine[2, 2] * np.arange(arrays[0].shape[2])
            crops = {}
            for number in (1, len(bounds)):
                low, high = bounds[number - 1]
                crops[number] = _empty_rows(arrays, slice(*np.searchsorted(z, [low, high])))
            stations = {
                c: split(np.asarray(v.data), v.affine, bounds, OVERLAP, crops) for c, v in volumes.items()
            }
            age = int(float(row.get("age") or patient.age or 60)) + round((vf.interval_days or 0) / 365.25)
            files = write_zip(
                path, stations, eid, vf.acq_date or date(2015, 1, 1), patient.sex or "O", age, seed
            )
            written.append(path)
            echo(f"  {path.name}: {files} DICOM files ({pid} {vf.visit})")
    return written
