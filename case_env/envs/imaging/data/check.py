"""`case-env data check`: read every file of a data root the way the server would, and report.

Decoding every volume is the only way to find a truncated gzip or a label map on the wrong grid before a
training run does. The decoded arrays are dropped after each patient, so memory stays at one patient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from case_env.core.errors import CaseEnvError
from case_env.envs.imaging.data.errors import DataError, Problem
from case_env.envs.imaging.data.index import VisitFiles
from case_env.envs.imaging.data.nifti import OBLIQUE_TOLERANCE_DEG, Geometry, Volume
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.data.volumetry import label_counts
from case_env.envs.imaging.settings import ImagingSettings

T = TypeVar("T")


@dataclass
class VisitSummary:
    visit: str
    session: str
    acq_date: str | None
    organs: dict[str, float]  # mL, 1 decimal


@dataclass
class PatientSummary:
    patient_id: str
    subject: str
    visits: list[VisitSummary] = field(default_factory=list)


@dataclass
class CheckReport:
    root: Path
    patients: list[PatientSummary]
    problems: list[Problem]

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity != "error"]

    def to_json(self) -> dict:
        return {
            "root": str(self.root),
            "patients": [
                {
                    "patient_id": p.patient_id,
                    "subject": p.subject,
                    "visits": [
                        {"visit": v.visit, "session": v.session, "acq_date": v.acq_date, "organs": v.organs}
                        for v in p.visits
                    ],
                }
                for p in self.patients
            ],
            "problems": [str(p) for p in self.errors],
            "warnings": [str(p) for p in self.warnings],
        }


def check_root(
    root: Path,
    settings: ImagingSettings | None = None,
    progress: Callable[[str], None] | None = None,
) -> CheckReport:
    store = PatientStore(root, settings)
    problems: list[Problem] = list(store.index.problems)
    seen = {(p.path, p.message) for p in problems}

    def attempt(fn: Callable[[], T], severity: str = "error") -> T | None:
        try:
            return fn()
        except DataError as exc:
            problem = replace(exc.problem(), severity=severity)
        except CaseEnvError as exc:
            problem = Problem("", str(exc), severity=severity)
        if (problem.path, problem.message) not in seen:
            seen.add((problem.path, problem.message))
            problems.append(problem)
        return None

    patients = []
    for pid, patient in store.index.patients.items():
        summary = PatientSummary(pid, patient.subject)
        for vf in patient.visits:
            summary.visits.append(_check_visit(store, pid, vf, attempt))
        patients.append(summary)
        store.cache.clear()
        if progress:
            progress(pid)
    return CheckReport(store.root, patients, problems)


def _check_visit(store: PatientStore, pid: str, vf: VisitFiles, attempt: Callable) -> VisitSummary:
    v = vf.visit
    reference = attempt(lambda: store.reference_geometry(pid, v))
    for channel, path in vf.channels.items():
        volume = attempt(lambda c=channel: store.image(pid, v, c))
        if volume is None or reference is None:
            continue
        grid = Geometry(volume.shape, volume.affine)
        tilt = volume.obliquity_deg()
        if tilt > OBLIQUE_TOLERANCE_DEG:
            message = f"oblique image axes ({tilt:.1f} degrees): slices are shown along the nearest axes"
            attempt(lambda p=path, m=message: _raise(DataError(store.rel(p), m, pid, v)), severity="warning")
        if not grid.matches(reference):
            message = f"image grid {grid.describe()} differs from the visit's other channels ({reference.describe()})"
            attempt(lambda p=path, m=message: _raise(DataError(store.rel(p), m, pid, v)))
    labels = attempt(lambda: store.organ_labels(pid, v)) if vf.organs is not None else None
    if vf.lesions is not None:
        attempt(lambda: store.lesion_labels(pid, v))
    attempt(lambda: store.lesions(pid, v))
    attempt(lambda: store.report(pid, v))
    attempt(lambda: store.manifest(pid, v))
    volumetry = attempt(lambda: store.volumetry(pid, v)) if vf.organs is not None else None
    if labels is not None and volumetry is not None and vf.volumes is not None:
        attempt(lambda: _compare_counts(store, labels, volumetry, vf, pid))
    organs = {name: round(m.volume_ml, 1) for name, m in (volumetry or {}).items()}
    return VisitSummary(v, vf.session, vf.acq_date.isoformat() if vf.acq_date else None, organs)


def _raise(exc: Exception) -> None:
    raise exc


def _compare_counts(store: PatientStore, labels: Volume, volumetry: dict, vf: VisitFiles, pid: str) -> None:
    counts = label_counts(labels.data)
    for organ, m in volumetry.items():
        if m.voxels and m.index < 256 and int(counts[m.index]) != m.voxels:
            raise DataError(
                store.rel(vf.volumes),
                f"volumes table says {organ} has {m.voxels} voxels, the label map has {int(counts[m.index])}",
                pid,
                vf.visit,
            )
