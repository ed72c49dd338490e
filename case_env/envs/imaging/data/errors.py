"""The imaging data layer's errors and problems: the core's data errors with the patient and visit they
concern, and a problem of a data root phrased for the person who owns the data."""

from __future__ import annotations

from dataclasses import dataclass

from case_env.core import errors


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a data root, phrased for the person who owns the data."""

    path: str  # relative to the data root; "" for the root itself
    message: str
    patient_id: str | None = None
    visit: str | None = None
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class UnknownPatientError(errors.CaseEnvError):
    def __init__(self, patient_id: str):
        super().__init__(f"unknown patient {patient_id!r}")
        self.patient_id = patient_id


class UnknownVisitError(errors.CaseEnvError):
    def __init__(self, visit: str, valid: list[str]):
        super().__init__(f"unknown visit {visit!r}; this patient has: {', '.join(valid)}")
        self.visit = visit
        self.valid = valid


class DataError(errors.DataError):
    """A file of one patient's visit is missing, unreadable or inconsistent."""

    def __init__(self, path: str, reason: str, patient_id: str | None = None, visit: str | None = None):
        super().__init__(path, reason)
        self.patient_id = patient_id
        self.visit = visit

    def problem(self) -> Problem:
        return Problem(self.path, self.reason, self.patient_id, self.visit)


class MissingDataError(DataError, errors.MissingDataError):
    """An optional or required file is absent (no lesion map, no report, a channel not acquired)."""
