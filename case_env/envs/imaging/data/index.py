"""Discover patients, visits and files in a data root, and say what is wrong with it.

Scanning only lists directories and reads small TSVs, never image data, so it is cheap enough to run at
server start. It is lenient the way real data needs: `.nii` or `.nii.gz`, any orientation, channel names
as BIDS `rec-` entities or UK Biobank suffixes (`_W`, `_F`, `_in`, `_opp`), sessions ordered by
`acq_time` when `sessions.tsv` has it, optional lesion maps, reports and phantom manifests. Every problem
found becomes a `Problem` naming the file; scanning never raises for bad data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from case_env.envs.imaging.data import layout
from case_env.envs.imaging.data.errors import Problem
from case_env.envs.imaging.labels import LabelTable
from case_env.envs.imaging.scan_protocol import CHANNELS
from case_env.envs.imaging.tsv import TsvError, read_tsv

_CHANNEL_ALIASES = {
    "water": "water",
    "w": "water",
    "fat": "fat",
    "f": "fat",
    "in": "in",
    "ip": "in",
    "inphase": "in",
    "opp": "opp",
    "op": "opp",
    "opphase": "opp",
    "out": "opp",
    "outphase": "opp",
}
_NIFTI = re.compile(r"\.nii(\.gz)?$")
PATIENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def visit_name(order: int) -> str:
    """baseline, follow_up, follow_up_2, ... by acquisition order."""
    return "baseline" if order == 0 else "follow_up" if order == 1 else f"follow_up_{order}"


def channel_of(filename: str) -> str | None:
    """The Dixon channel a file name denotes, or None."""
    stem = _NIFTI.sub("", filename)
    tokens = stem.split("_")
    for token in tokens:
        if token.startswith("rec-"):
            return _CHANNEL_ALIASES.get(token[4:].lower())
    candidates = [tokens[-1]]
    if tokens[-1].lower() in ("t1w", "dixon") and len(tokens) > 1:
        candidates.append(tokens[-2])
    for token in candidates:
        channel = _CHANNEL_ALIASES.get(token.lower())
        if channel:
            return channel
    return None


@dataclass(frozen=True)
class VisitFiles:
    visit: str  # baseline | follow_up | follow_up_N
    session: str  # ses-01
    acq_date: date | None
    interval_days: int | None
    channels: dict[str, Path]
    organs: Path | None = None
    lesions: Path | None = None
    lesion_sidecar: Path | None = None
    volumes: Path | None = None
    report_md: Path | None = None
    report_json: Path | None = None
    phantom: Path | None = None

    def sidecar(self, channel: str) -> Path | None:
        path = self.channels.get(channel)
        if path is None:
            return None
        candidate = path.with_name(_NIFTI.sub("", path.name) + ".json")
        return candidate if candidate.is_file() else None


@dataclass(frozen=True)
class PatientFiles:
    patient_id: str  # public id (case0001)
    subject: str  # sub-0001
    sex: str | None
    age: str | None
    visits: tuple[VisitFiles, ...]
    fields: dict[str, str] = field(default_factory=dict)  # the participants.tsv row, as given

    def visit(self, name: str) -> VisitFiles | None:
        return next((v for v in self.visits if v.visit == name), None)


@dataclass
class DataIndex:
    root: Path
    patients: dict[str, PatientFiles] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    label_table: LabelTable = field(default_factory=LabelTable.vista3d)

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    def patient_ids(self) -> list[str]:
        return list(self.patients)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]


def _parse_date(text: str) -> date | None:
    try:
        return date.fromisoformat(text[:10])
    except ValueError:
        return None


def _participants(index: DataIndex) -> dict[str, dict[str, str]]:
    path = index.root / layout.PARTICIPANTS
    if not path.is_file():
        return {}
    try:
        rows = read_tsv(path, required=("participant_id",))
    except (TsvError, OSError) as exc:
        index.problems.append(Problem(index.rel(path), f"cannot read participants table: {exc}"))
        return {}
    out: dict[str, dict[str, str]] = {}
    for row in rows:
        sub = row["participant_id"]
        if sub in out:
            index.problems.append(Problem(index.rel(path), f"participant {sub!r} is listed twice"))
        out[sub] = row
    return out


def _sessions_table(index: DataIndex, sub: str, pid: str) -> dict[str, dict[str, str]] | None:
    path = index.root / layout.sessions_tsv(sub)
    if not path.is_file():
        return None
    try:
        rows = read_tsv(path, required=("session_id",))
    except (TsvError, OSError) as exc:
        index.problems.append(Problem(index.rel(path), f"cannot read sessions table: {exc}", pid))
        return None
    out: dict[str, dict[str, str]] = {}
    for number, row in enumerate(rows, start=2):
        ses = row["session_id"]
        if ses in out:
            index.problems.append(
                Problem(index.rel(path), f"duplicate session label {ses!r} (again on line {number})", pid)
            )
            continue
        out[ses] = row
    return out


def _first(directory: Path, pattern: str) -> Path | None:
    hits = sorted(directory.glob(pattern)) if directory.is_dir() else []
    return hits[0] if hits else None


def _visit_files(
    index: DataIndex, sub: str, ses: str, visit: str, pid: str, row: dict[str, str]
) -> VisitFiles:
    root = index.root
    anat = root / layout.anat_dir(sub, ses)
    channels: dict[str, Path] = {}
    for path in sorted(anat.iterdir()) if anat.is_dir() else []:
        if not _NIFTI.search(path.name):
            continue
        channel = channel_of(path.name)
        if channel is None:
            index.problems.append(
                Problem(
                    index.rel(path),
                    "cannot tell which Dixon channel this is (expected rec-water/fat/in/opp "
                    "or a _W, _F, _in, _opp suffix); ignored",
                    pid,
                    visit,
                    "warning",
                )
            )
            continue
        if channel in channels:
            index.problems.append(
                Problem(
                    index.rel(path),
                    f"second file for channel {channel!r} (also {channels[channel].name}); using the first",
                    pid,
                    visit,
                )
            )
            continue
        channels[channel] = path
    for channel in CHANNELS:
        if channel not in channels:
            index.problems.append(
                Problem(
                    index.rel(anat),
                    f"missing Dixon channel {channel!r} (expected a file such as "
                    f"{layout.channel_image(sub, ses, channel).name})",
                    pid,
                    visit,
                )
            )
    seg = root / layout.segmentation_dir(sub, ses)
    organs = _first(seg, "*desc-organs_dseg.nii*")
    if organs is None:
        index.problems.append(
            Problem(
                index.rel(seg),
                f"no organ label map (expected {layout.organ_labels(sub, ses).name})",
                pid,
                visit,
            )
        )
    lesions = _first(seg, "*desc-lesions_dseg.nii*")
    lesion_sidecar = _first(seg, "*desc-lesions_dseg.json")
    reports = root / layout.REPORTS / sub / ses
    interval = row.get("interval_days", "")
    return VisitFiles(
        visit=visit,
        session=ses,
        acq_date=_parse_date(row.get("acq_time", "")),
        interval_days=int(interval) if interval.lstrip("-").isdigit() else None,
        channels=channels,
        organs=organs,
        lesions=lesions,
        lesion_sidecar=lesion_sidecar,
        volumes=_first(seg, "*desc-organs_volumes.tsv"),
        report_md=_first(reports, "*report.md"),
        report_json=_first(reports, "*report.json"),
        phantom=_first(root / sub / ses, "*_phantom.json"),
    )


def _patient(index: DataIndex, subdir: Path, participant: dict[str, str]) -> PatientFiles | None:
    sub = subdir.name
    pid = participant.get("case_id") or sub
    if not PATIENT_ID.match(pid):
        index.problems.append(Problem(index.rel(subdir), f"patient id {pid!r} is not a valid identifier"))
        return None
    table = _sessions_table(index, sub, pid)
    dirs = {p.name for p in subdir.iterdir() if p.is_dir() and p.name.startswith("ses-")}
    if not dirs:
        index.problems.append(
            Problem(index.rel(subdir), "no sessions (expected ses-<label>/ directories)", pid)
        )
        return None
    if table is not None:
        for ses in table:
            if ses not in dirs:
                index.problems.append(
                    Problem(
                        index.rel(index.root / layout.sessions_tsv(sub)),
                        f"session {ses!r} is listed but has no directory",
                        pid,
                    )
                )
    rows = table or {}
    sessions = sorted(dirs)
    dates = {ses: _parse_date(rows.get(ses, {}).get("acq_time", "")) for ses in sessions}
    if all(dates.values()):
        sessions.sort(key=lambda ses: (dates[ses], ses))
    visits = []
    first_date = dates[sessions[0]]
    for order, ses in enumerate(sessions):
        session_row = dict(rows.get(ses, {}))
        if "interval_days" not in session_row and first_date and dates[ses]:
            session_row["interval_days"] = str((dates[ses] - first_date).days)
        visits.append(_visit_files(index, sub, ses, visit_name(order), pid, session_row))
    sex, age = participant.get("sex"), participant.get("age")
    return PatientFiles(
        pid,
        sub,
        sex if sex not in (None, "", "n/a") else None,
        age if age not in (None, "", "n/a") else None,
        tuple(visits),
        dict(participant),
    )


def holds_imaging(root: Path) -> bool:
    """Whether a root is meant to hold imaging data: a subject, a participants table or a dataset
    description (BIDS), or nothing else at all (an empty root is refused, never skipped)."""
    entries = list(root.iterdir()) if root.is_dir() else []
    markers = {layout.PARTICIPANTS.name, "participants.json", "dataset_description.json"}
    return not entries or any(p.name.startswith("sub-") or p.name in markers for p in entries)


def scan(root: Path) -> DataIndex:
    """Index a data root; problems are collected, never raised."""
    root = Path(root).expanduser().resolve()
    index = DataIndex(root)
    if not root.exists():
        index.problems.append(Problem("", f"data root {root} does not exist"))
        return index
    if not root.is_dir():
        index.problems.append(Problem("", f"data root {root} is not a directory"))
        return index
    table_path = root / layout.LABEL_TABLE
    if table_path.is_file():
        try:
            index.label_table = LabelTable.read_tsv(table_path)
        except (ValueError, OSError) as exc:
            index.problems.append(Problem(index.rel(table_path), f"cannot read label table: {exc}"))
    participants = _participants(index)
    subjects = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("sub-"))
    if not subjects:
        if holds_imaging(root):  # a root of the other environments' cases alone is not imaging's problem
            index.problems.append(
                Problem("", f"data root {root} contains no subjects (expected sub-<label>/ directories)")
            )
        return index
    for subdir in subjects:
        patient = _patient(index, subdir, participants.get(subdir.name, {}))
        if patient is None:
            continue
        if patient.patient_id in index.patients:
            index.problems.append(
                Problem(index.rel(subdir), f"patient id {patient.patient_id!r} is used twice")
            )
            continue
        index.patients[patient.patient_id] = patient
    return index
