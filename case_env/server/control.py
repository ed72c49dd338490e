"""Find a running case-env server, or start one for the length of a job (training, demo rollouts)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx


def reachable(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def ensure_server(
    url: str, data_root: Path, workers: int = 2, timeout_s: float = 120
) -> subprocess.Popen | None:
    """Start `case-env serve` when nothing answers at `url`; None when a server is already there."""
    if reachable(url):
        return None
    parsed = httpx.URL(url)
    if parsed.host not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"no case-env server answers at {url}, and only a local one can be started")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "case_env.cli",
            "serve",
            "--data-root",
            str(data_root),
            "--port",
            str(parsed.port or 8000),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ]
    )
    deadline = time.monotonic() + timeout_s
    while not reachable(url):
        if process.poll() is not None or time.monotonic() > deadline:
            process.terminate()
            raise SystemExit(f"case-env server did not start at {url}")
        time.sleep(0.3)
    return process


def stop(process: subprocess.Popen | None) -> None:
    if process is not None:
        process.terminate()
        process.wait(timeout=60)
