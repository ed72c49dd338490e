"""Exception types of the data layer.

Each carries a path relative to the data root and a reason separately, so the CLI can say exactly which
file is wrong while the server can answer without revealing filesystem paths.
"""

from __future__ import annotations

from dataclasses import dataclass


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


class CaseEnvError(Exception):
    """Base of every error this package raises on purpose."""


class UnknownPatientError(CaseEnvError):
    def __init__(self, patient_id: str):
        super().__init__(f"unknown patient {patient_id!r}")
        self.patient_id = patient_id


class UnknownVisitError(CaseEnvError):
    def __init__(self, visit: str, valid: list[str]):
        super().__init__(f"unknown visit {visit!r}; this patient has: {', '.join(valid)}")
        self.visit = visit
        self.valid = valid


class DataError(CaseEnvError):
    """A file in the data root is missing, unreadable or inconsistent."""

    def __init__(self, path: str, reason: str, patient_id: str | None = None, visit: str | None = None):
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason
        self.patient_id = patient_id
        self.visit = visit

    def problem(self) -> Problem:
        return Problem(self.path, self.reason, self.patient_id, self.visit)


class MissingDataError(DataError):
    """An optional or required file is absent (no lesion map, no report, a channel not acquired)."""


class CommandError(CaseEnvError):
    """What a command cannot do with the input it was given: printed as one line, with an exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code
