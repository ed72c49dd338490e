"""Clinical tables of a data root: each participant's diagnoses with the date first recorded.

The table lives at `phenotype/diagnoses.tsv` (BIDS phenotype folder, with a JSON sidecar describing the
columns) or is given with `bank build --clinical FILE`. It is read in the shapes UK Biobank users have:

- long: one row per diagnosis, `participant_id` (sub-XXXX) or `eid`, `code`, `date` (YYYY-MM-DD), and an
  optional `title`;
- wide, as a showcase export of the hospital-inpatient fields: `eid`, `41270-0.0`, `41270-0.1`, ... (ICD-10
  diagnoses) and `41280-0.0`, ... (the date each was first recorded, array index matching the code's).

An `eid` is matched to a participant through the `eid` column of participants.tsv. ICD-10 codes are
accepted with or without the dot (UK Biobank writes K760 for K76.0). Every row that cannot be used (a
malformed code, a bad or missing date, a participant not in the data root) is a problem naming the file
and the row; the rest of the table is used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from case_env.envs.imaging.icd10 import chapter_of, normalise_code, title_of
from case_env.envs.imaging.tsv import TsvError, read_table, write_tsv

if TYPE_CHECKING:
    from case_env.envs.imaging.data.store import PatientStore

DIAGNOSES = Path("phenotype") / "diagnoses.tsv"
COLUMNS = ("participant_id", "eid", "code", "date", "title")
SIDECAR = {
    "participant_id": {"Description": "Participant label of the data root (sub-XXXX)."},
    "eid": {"Description": "UK Biobank participant id (pseudonymised per application)."},
    "code": {"Description": "ICD-10 code of a hospital-inpatient diagnosis (UK Biobank field 41270)."},
    "date": {
        "Description": "Date the diagnosis was first recorded (UK Biobank field 41280).",
        "Format": "YYYY-MM-DD",
    },
    "title": {"Description": "ICD-10 title of the code (WHO wording)."},
}
_WIDE_CODE = re.compile(r"^(?:p)?41270[-_](?:a?)(\d+)(?:\.(\d+))?$")
_WIDE_DATE = re.compile(r"^(?:p)?41280[-_](?:a?)(\d+)(?:\.(\d+))?$")
EARLIEST = date(1901, 1, 1)  # earlier dates in a diagnosis table are placeholders, not history


@dataclass(frozen=True)
class DiagnosisRecord:
    code: str  # with the dot: K76.0
    title: str
    recorded: date


@dataclass
class ClinicalTable:
    diagnoses: dict[str, list[DiagnosisRecord]]  # participant_id -> records, by date
    problems: list[str]
    source: str


def _parse_date(text: str) -> date | None:
    try:
        value = date.fromisoformat(text.strip()[:10])
    except ValueError:
        return None
    return value if EARLIEST <= value <= date.today() else None


def _wide_pairs(row: Mapping[str, str]) -> list[tuple[str, str]]:
    """(code, date) pairs of a wide row, matched by array index."""
    codes, dates = {}, {}
    for column, value in row.items():
        if (m := _WIDE_CODE.match(column)) and value.strip():
            codes[m.group(2) or m.group(1)] = value
        elif (m := _WIDE_DATE.match(column)) and value.strip():
            dates[m.group(2) or m.group(1)] = value
    return [(codes[k], dates.get(k, "")) for k in sorted(codes, key=int)]


@dataclass(frozen=True)
class ParticipantKeys:
    """How a phenotype table's row names its patient: by eid (which decides when a row has both, so a
    table made for another root keeps working), else by participant label (sub-XXXX or the public id)."""

    labels: Mapping[str, str]
    eids: Mapping[str, str]

    @classmethod
    def of(cls, store: PatientStore) -> ParticipantKeys:
        labels, eids = {}, {}
        for pid in store.patient_ids():
            patient = store.patient(pid)
            labels[patient.subject] = labels[pid] = pid
            if patient.fields.get("eid"):
                eids[patient.fields["eid"]] = pid
        return cls(labels, eids)

    def resolve(self, row: Mapping[str, str]) -> tuple[str, str]:
        """(the patient id, "" when it is not in the root; how the row names it, for messages)."""
        eid, label = row.get("eid", "").strip(), row.get("participant_id", "").strip()
        if eid:
            return self.eids.get(eid, ""), f"eid {eid}"
        return self.labels.get(label, ""), f"participant {label or '(empty)'}"


def read_clinical(path: Path, keys: ParticipantKeys) -> ClinicalTable:
    """Diagnoses per patient from a long or wide table."""
    name = path.name
    try:
        rows = read_table(path)
    except (OSError, TsvError) as exc:
        return ClinicalTable({}, [f"{name}: cannot read the clinical table ({exc})"], str(path))
    header = set(rows[0]) if rows else set()
    wide = any(_WIDE_CODE.match(c) for c in header)
    if not rows:
        return ClinicalTable({}, [f"{name}: the clinical table has no rows"], str(path))
    if not wide and not ({"code", "date"} <= header and header & {"participant_id", "eid"}):
        return ClinicalTable(
            {},
            [
                f"{name}: expected columns participant_id or eid, code and date (long) or eid with "
                f"41270-0.N and 41280-0.N (wide); found {', '.join(sorted(header)) or 'none'}"
            ],
            str(path),
        )
    out: dict[str, dict[str, DiagnosisRecord]] = {}
    problems: list[str] = []
    for n, row in enumerate(rows, start=2):  # line 1 is the header
        where = f"{name} line {n}"
        pid, named = keys.resolve(row)
        if not pid:
            problems.append(f"{where}: {named} is not in the data root's participants.tsv")
            continue
        pairs = _wide_pairs(row) if wide else [(row.get("code", ""), row.get("date", ""))]
        for raw_code, raw_date in pairs:
            code = normalise_code(raw_code)
            if code is None:
                problems.append(f"{where}: {raw_code.strip()!r} is not an ICD-10 code (e.g. K76.0 or K760)")
                continue
            if not chapter_of(code):
                problems.append(f"{where}: {code} is in no ICD-10 chapter (unknown code)")
                continue
            recorded = _parse_date(raw_date)
            if recorded is None:
                problems.append(
                    f"{where}: date {raw_date.strip()!r} of {code} is not a date between "
                    f"{EARLIEST.isoformat()} and today (YYYY-MM-DD)"
                )
                continue
            title = (row.get("title", "").strip() if not wide else "") or title_of(code)
            kept = out.setdefault(pid, {})
            if code not in kept or recorded < kept[code].recorded:  # the date it was first recorded
                kept[code] = DiagnosisRecord(code, title, recorded)
    diagnoses = {pid: sorted(v.values(), key=lambda r: (r.recorded, r.code)) for pid, v in out.items()}
    return ClinicalTable(diagnoses, problems, str(path))


def write_diagnoses(root: Path, rows: list[tuple[str, str, DiagnosisRecord]]) -> Path:
    """The long table and its sidecar, from rows of (participant_id, eid, record)."""
    path = root / DIAGNOSES
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tsv(path, COLUMNS, [(pid, eid, r.code, r.recorded.isoformat(), r.title) for pid, eid, r in rows])
    path.with_suffix(".json").write_text(json.dumps(SIDECAR, indent=2) + "\n", encoding="utf-8")
    return path


def load_clinical(store: PatientStore, path: Path | None = None) -> ClinicalTable | None:
    """The data root's table (phenotype/diagnoses.tsv), or the file given; None when there is neither."""
    path = path or store.root / DIAGNOSES
    if not path.is_file():
        return None
    return read_clinical(path, ParticipantKeys.of(store))
