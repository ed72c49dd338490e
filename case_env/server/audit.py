"""The audit log: one JSON line per tool call, refused calls included.

It is the one place where case ids and arguments are written down on purpose. Bearer tokens and image
bytes never are. Each line goes out in a single `write` on a file opened with O_APPEND, so lines from
several workers sharing the file never interleave. Every line is strict JSON: a non-finite number a client
sent (`NaN`, `Infinity`, `1e400`) is written as a string.

A log that cannot be written is refused before the server starts (`problem`, which `case-env serve`
checks); one whose writes start failing later (a full disk) makes the worker not ready: the call whose line
was lost answers 503, which clients retry, and every later call is refused until the worker restarts, so no
call goes unrecorded. Failures are counted in /metrics.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def problem(path: Path) -> str | None:
    """Why `path` cannot take the audit log, or None. A file that is not a regular one (a device, a pipe)
    gets an empty line as a probe, which is how /dev/full shows it takes nothing."""
    try:
        fd = _open(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.write(fd, b"\n")
    except OSError as exc:
        return f"writing fails: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return None


def _open(path: Path) -> int:
    if path.parent.exists() and not path.parent.is_dir():
        raise NotADirectoryError(20, f"its folder {path.parent} is a file")
    if path.is_dir():
        raise IsADirectoryError(21, "it is a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def _finite(value: Any) -> Any:
    """`value` with every non-finite float as a string, as strict JSON needs."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class AuditLog:
    def __init__(self, path: Path | None):
        self.path = path
        self._fd: int | None = None
        self.failed: str | None = None  # why the last write failed; the worker is not ready from then on
        self.failures = 0
        if path is not None:
            self._fd = _open(path)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def write(
        self,
        *,
        episode_id: str | None,
        case_id: str | None,
        tool: str,
        arguments: object,
        status: str,
        http_status: int,
        latency_ms: float,
    ) -> None:
        if self._fd is None:
            return
        record = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "episode_id": episode_id,
            "patient_id": case_id,  # the CASE schema's name, as in the request
            "tool": tool,
            "arguments": arguments,
            "status": status,
            "http_status": http_status,
            "latency_ms": round(latency_ms, 2),
        }
        try:
            line = json.dumps(record, default=str, ensure_ascii=False, allow_nan=False)
        except ValueError:  # NaN or Infinity in the arguments: strict JSON has no such number
            line = json.dumps(_finite(record), default=str, ensure_ascii=False)
        try:
            os.write(
                self._fd, (line + "\n").encode("utf-8", "backslashreplace")
            )  # a bad character never costs a line
        except OSError as exc:
            self.failures += 1
            self.failed = f"audit log {self.path}: {exc.strerror or exc}"
            raise AuditWriteError(self.failed) from None

    def refusal(self, method: str, path: str, code: str, http_status: int) -> None:
        """A tool call refused before its route ran (token, body size, undecodable or invalid body): its episode
        and case are not known yet, but it is still a call and gets its line."""
        if method == "POST" and path.startswith("/v1/tools/"):
            with contextlib.suppress(AuditWriteError):  # the refusal stands; the failure is on record
                self.write(
                    episode_id=None,
                    case_id=None,
                    tool=path.rsplit("/", 1)[-1][:64],
                    arguments=None,
                    status=code,
                    http_status=http_status,
                    latency_ms=0.0,
                )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class AuditWriteError(OSError):
    """A call's audit line could not be written."""
