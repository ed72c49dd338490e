"""`case-env ingest ukb`: UK Biobank field-20201 zips into the data layout of data/README.md.

Per visit (one zip): read the 24 series, stitch each channel's six stations on one grid (`stations`),
reorient to RAS+ and write the four NIfTI volumes with JSON sidecars of the acquisition facts. A visit is
written to temporary names and renamed into place, then marked finished (`.case-env-ingest.json`, with
the source zip's size and mtime), so an interrupted run leaves no half visit and a second run skips every
finished one. Visits run in parallel processes (`--jobs`). A zip that cannot be ingested is reported for
that visit alone, naming the file and what is wrong; the input directory is only ever read.

participants.tsv gets one row per eid (participant_id sub-<eid>, a stable public case id in order of
first ingestion, sex and age from the DICOM header when present); each subject's sessions.tsv gets the
StudyDate as acq_time, the UK Biobank instance and the interval from the first visit.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import nibabel as nib
import numpy as np

from case_env import __version__
from case_env.envs.imaging.data import layout
from case_env.envs.imaging.data.nifti import save_volume
from case_env.envs.imaging.tsv import TsvError, read_tsv, write_tsv
from case_env.envs.imaging.ukb import protocol
from case_env.envs.imaging.ukb.dicom import ZipError, read_zip, require_pydicom
from case_env.envs.imaging.ukb.stations import GeometryError, Stitched, stitch

MARKER = ".case-env-ingest.json"
PARTIAL = ".case-env-partial"  # a visit is written here first, then renamed into place


@dataclass(frozen=True)
class VisitJob:
    zip_path: Path
    bulk: protocol.BulkFile
    subject: str
    out: Path
    slice_mm: float | None = None


@dataclass
class VisitResult:
    job: VisitJob
    status: str  # written | skipped | failed
    seconds: float = 0.0
    problem: str = ""
    study_date: str = ""
    patient: dict = field(default_factory=dict)


@dataclass
class IngestSummary:
    results: list[VisitResult]
    problems: list[str]

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)


def _source_stamp(path: Path) -> dict:
    st = path.stat()
    return {"source": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _marker(job: VisitJob) -> Path:
    return job.out / layout.anat_dir(job.subject, job.bulk.session) / MARKER


def finished(job: VisitJob) -> dict | None:
    """The marker of a finished visit whose source zip is unchanged, else None."""
    try:
        mark = json.loads(_marker(job).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    stamp = _source_stamp(job.zip_path)
    return mark if all(mark.get(k) == v for k, v in stamp.items()) else None


def _boundaries(stitched: Stitched, normal_z: float, step: float) -> list[list[float]] | None:
    """Station z ranges in RAS mm (station order), tiling the volume at the overlaps' midpoints."""
    if abs(normal_z) < 0.99:
        return None  # not an axial acquisition: stations are not z ranges
    ranges = [(lo * np.sign(normal_z), hi * np.sign(normal_z)) for lo, hi in stitched.ranges]
    ranges = [(min(a, b), max(a, b)) for a, b in ranges]
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    cuts = {}
    for a, b in itertools.pairwise(order):
        cuts[(a, b)] = (ranges[a][1] + ranges[b][0]) / 2
    out = [[0.0, 0.0] for _ in ranges]
    for pos, i in enumerate(order):
        low = ranges[i][0] - step / 2 if pos == 0 else cuts[(order[pos - 1], i)]
        high = ranges[i][1] + step / 2 if pos == len(order) - 1 else cuts[(i, order[pos + 1])]
        out[i] = [round(float(low), 3), round(float(high), 3)]
    return out


def _sidecar(job: VisitJob, channel: str, stations, boundaries, step: float) -> dict:
    first = stations[0].facts
    sidecar: dict = {"Modality": "MR"}
    for key in ("Manufacturer", "ManufacturerModelName", "MagneticFieldStrength", "FlipAngle"):
        if key in first:
            sidecar[key] = first[key]
    for key in ("RepetitionTime", "EchoTime"):  # DICOM ms, BIDS s
        if isinstance(first.get(key), (int, float)):
            sidecar[key] = round(first[key] / 1000.0, 6)
    sidecar.update(
        {
            "DixonChannel": channel,
            "Stations": len(stations),
            "SeriesDescription": [s.facts.get("SeriesDescription", "") for s in stations],
            "StationSliceSpacingMm": [round(s.step(), 4) for s in stations],
            "StitchedFrom": [s.facts.get("SeriesInstanceUID", "") for s in stations],
            "SliceSpacingMm": round(step, 4),
            "Stitching": "stations resampled to one slice spacing (linear), overlaps blended with the "
            "logistic weight of recoh/pipeline",
            "UKBiobankField": job.bulk.field,
            "UKBiobankInstance": job.bulk.instance,
            "SourceFile": job.bulk.name(),
            "GeneratedBy": f"case-env {__version__} ingest ukb",
        }
    )
    if boundaries:
        sidecar["StationBoundariesMm"] = boundaries
    return sidecar


def ingest_visit(job: VisitJob) -> VisitResult:
    """One zip into the layout; never raises for a bad zip (the result says what is wrong)."""
    start = time.perf_counter()
    mark = finished(job)
    if mark:
        return VisitResult(job, "skipped", 0.0, "", mark.get("study_date", ""), mark.get("patient", {}))
    try:
        visit = read_zip(job.zip_path)
        if visit.patient.get("PatientID") and visit.patient["PatientID"] != job.bulk.eid:
            raise ZipError(
                f"{job.bulk.name()}: PatientID {visit.patient['PatientID']} differs from the eid in the file name"
            )
        written = []
        reference = None
        for channel in protocol.CHANNEL_OF_SUFFIX.values():
            stations = visit.channels[channel]
            try:
                stitched = stitch(stations, order=1, slice_mm=job.slice_mm)
            except GeometryError as exc:
                raise ZipError(f"{job.bulk.name()} channel {channel}: {exc}") from exc
            if reference is None:
                reference = stitched
            elif stitched.data.shape != reference.data.shape or not np.allclose(
                stitched.affine_ras, reference.affine_ras, atol=1e-3
            ):
                raise ZipError(f"{job.bulk.name()}: channel {channel} stitches to another grid than water")
            image = nib.as_closest_canonical(nib.Nifti1Image(stitched.data, stitched.affine_ras))
            step = float(np.linalg.norm(stitched.affine_ras[:3, 2]))
            normal_z = float(np.cross(stations[0].row_dir, stations[0].col_dir)[2])
            path = job.out / layout.channel_image(job.subject, job.bulk.session, channel)
            tmp = path.parent / PARTIAL / path.name
            save_volume(tmp, np.asanyarray(image.dataobj), image.affine)
            sidecar = _sidecar(job, channel, stations, _boundaries(stitched, normal_z, step), step)
            side = path.with_name(path.name.replace(".nii.gz", ".json"))
            side_tmp = side.parent / PARTIAL / side.name
            side_tmp.write_text(json.dumps(sidecar, indent=2) + "\n", encoding="utf-8")
            written.append((tmp, path))
            written.append((side_tmp, side))
        for tmp, path in written:
            tmp.replace(path)
        (written[0][0].parent).rmdir()
    except (ZipError, MemoryError, OSError) as exc:
        # nothing of a failed visit stays behind: the next run starts it afresh
        shutil.rmtree(job.out / layout.anat_dir(job.subject, job.bulk.session) / PARTIAL, ignore_errors=True)
        problem = str(exc) if isinstance(exc, ZipError) else f"{job.bulk.name()}: {exc}"
        return VisitResult(job, "failed", time.perf_counter() - start, problem)
    study = visit.study_date.isoformat() if visit.study_date else ""
    mark = {
        **_source_stamp(job.zip_path),
        "study_date": study,
        "patient": visit.patient,
        "version": __version__,
    }
    _marker(job).write_text(json.dumps(mark, indent=2) + "\n", encoding="utf-8")
    return VisitResult(job, "written", time.perf_counter() - start, "", study, visit.patient)


def plan(zips: Path, out: Path, slice_mm: float | None = None) -> tuple[list[VisitJob], list[str]]:
    """The visits to ingest and the files that are not field-20201 visits."""
    problems: list[str] = []
    if not zips.is_dir():
        raise ZipError(f"--zips {zips}: not a directory")
    out_resolved, zips_resolved = out.resolve(), zips.resolve()
    if out_resolved == zips_resolved or zips_resolved in out_resolved.parents:
        raise ZipError(f"--out {out} is inside --zips {zips}; the input directory is never written to")
    existing = _existing_participants(out)
    subjects = {row["eid"]: row["participant_id"] for row in existing if row.get("eid")}
    jobs = []
    for path in sorted(zips.iterdir()):
        if path.is_dir() or path.suffix.lower() != ".zip":
            continue
        bulk = protocol.parse_bulk_name(path.name)
        if bulk is None:
            problems.append(
                f"{path.name}: not a UK Biobank bulk file name (<eid>_<field>_<instance>_<array>.zip)"
            )
            continue
        if bulk.field != protocol.FIELD:
            problems.append(
                f"{path.name}: field {bulk.field}, not {protocol.FIELD} (Dixon neck-to-knee); skipped"
            )
            continue
        subject = subjects.get(bulk.eid, f"sub-{bulk.eid}")
        jobs.append(VisitJob(path, bulk, subject, out, slice_mm))
    return jobs, problems


def _existing_participants(out: Path) -> list[dict[str, str]]:
    try:
        return read_tsv(out / layout.PARTICIPANTS)
    except (OSError, TsvError):
        return []


def _age(text: str) -> str:
    return str(int(text[:-1])) if text[:-1].isdigit() and text.endswith("Y") else ""


def _write_tables(out: Path, results: list[VisitResult]) -> None:
    existing = {row["eid"]: row for row in _existing_participants(out) if row.get("eid")}
    visits: dict[str, list[VisitResult]] = {}
    for r in results:
        if r.status != "failed":
            visits.setdefault(r.job.bulk.eid, []).append(r)
    numbers = [int(row["case_id"][4:]) for row in existing.values() if row.get("case_id", "")[4:].isdigit()]
    next_case = max(numbers, default=0) + 1
    for eid in sorted(visits, key=int):
        if eid in existing:
            continue
        first = min(visits[eid], key=lambda r: r.job.bulk.instance)
        existing[eid] = {
            "participant_id": first.job.subject,
            "case_id": f"case{next_case:04d}",
            "eid": eid,
            "sex": first.patient.get("PatientSex", "") or "n/a",
            "age": _age(first.patient.get("PatientAge", "")) or "n/a",
        }
        next_case += 1
    rows = sorted(existing.values(), key=lambda row: row["case_id"])
    write_tsv(
        out / layout.PARTICIPANTS,
        ["participant_id", "case_id", "eid", "sex", "age"],
        [
            [r["participant_id"], r["case_id"], r["eid"], r.get("sex", "n/a"), r.get("age", "n/a")]
            for r in rows
        ],
    )
    for done in visits.values():
        sub = done[0].job.subject
        sessions = {}
        for path in sorted((out / sub).glob(f"ses-*/anat/{MARKER}")):
            mark = json.loads(path.read_text(encoding="utf-8"))
            sessions[path.parent.parent.name] = mark.get("study_date", "")
        instance = {r.job.bulk.session: r.job.bulk.instance for r in done}
        dates = [date.fromisoformat(d) for d in sessions.values() if d]
        first_date = min(dates) if dates else None
        table = []
        for ses in sorted(sessions):
            day = sessions[ses]
            interval = (date.fromisoformat(day) - first_date).days if day and first_date else "n/a"
            table.append([ses, day or "n/a", instance.get(ses, "n/a"), interval])
        write_tsv(
            out / layout.sessions_tsv(sub), ["session_id", "acq_time", "ukb_instance", "interval_days"], table
        )
    description = out / layout.DATASET_DESCRIPTION
    if not description.exists():
        description.write_text(
            json.dumps(
                {
                    "Name": "UK Biobank neck-to-knee Dixon MRI (field 20201), ingested",
                    "BIDSVersion": "1.10.0",
                    "DatasetType": "raw",
                    "GeneratedBy": [{"Name": "case-env ingest ukb", "Version": __version__}],
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )


def ingest(
    zips: Path,
    out: Path,
    jobs: int = 1,
    slice_mm: float | None = None,
    progress: Callable[[VisitResult, int, int], None] | None = None,
) -> IngestSummary:
    """Every field-20201 zip of `zips` into the data root `out`."""
    visits, problems = plan(zips, out, slice_mm)
    if visits:
        require_pydicom()  # one clear line, not one failure per visit
    out.mkdir(parents=True, exist_ok=True)
    results: list[VisitResult] = []
    workers = max(1, min(jobs or os.cpu_count() or 1, len(visits) or 1))
    if workers == 1:
        for job in visits:
            results.append(ingest_visit(job))
            if progress:
                progress(results[-1], len(results), len(visits))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(ingest_visit, job) for job in visits]
            for future in as_completed(futures):
                results.append(future.result())
                if progress:
                    progress(results[-1], len(results), len(visits))
    results.sort(key=lambda r: (r.job.bulk.eid, r.job.bulk.instance))
    problems += [r.problem for r in results if r.status == "failed"]
    _write_tables(out, results)
    return IngestSummary(results, problems)
