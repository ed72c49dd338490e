"""The audit log: one JSON line per tool call, refused calls included.

It is the one place where patient ids and arguments are written down on purpose. Bearer tokens and image
bytes never are. Each line goes out in a single `write` on a file opened with O_APPEND, so lines from
several workers sharing the file never interleave.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path


class AuditLog:
    def __init__(self, path: Path | None):
        self.path = path
        self._fd: int | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def write(
        self,
        *,
        episode_id: str | None,
        patient_id: str | None,
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
            "patient_id": patient_id,
            "tool": tool,
            "arguments": arguments,
            "status": status,
            "http_status": http_status,
            "latency_ms": round(latency_ms, 2),
        }
        line = json.dumps(record, default=str, ensure_ascii=False) + "\n"
        os.write(self._fd, line.encode("utf-8", "backslashreplace"))  # a bad character never costs a line

    def refusal(self, method: str, path: str, code: str, http_status: int) -> None:
        """A tool call refused before its route ran (token, body size, undecodable or invalid body): its episode
        and patient are not known yet, but it is still a call and gets its line."""
        if method == "POST" and path.startswith("/v1/tools/"):
            self.write(
                episode_id=None,
                patient_id=None,
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
