"""Exception types every layer shares.

A data error carries a path relative to the data root and a reason separately, so the command line can say
exactly which file is wrong while the server can answer without revealing filesystem paths. Environments
subclass them with what they know besides (the case and the part of it, say).
"""

from __future__ import annotations


class CaseEnvError(Exception):
    """Base of every error this package raises on purpose."""


class DataError(CaseEnvError):
    """A file in the data root is missing, unreadable or inconsistent (the server answers 503, naming the
    reason and never the path)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason


class MissingDataError(DataError):
    """Something a case does not have (the server answers the model `not_available` with the reason)."""


class CommandError(CaseEnvError):
    """What a command cannot do with the input it was given: printed as one line, with an exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code
