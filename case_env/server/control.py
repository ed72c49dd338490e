"""Find a running case-env server, or start one for the length of a job (training, demo rollouts).

A server started for a training run is sized to the run: every trajectory has at most a turn's calls in flight
(`multi_turn.max_parallel_calls`), so a GRPO step can put `batch x group size x that` calls on it at once. Each
worker serves `CASE_ENV_MAX_IN_FLIGHT` (256) calls at once and queues the rest up to `CASE_ENV_MAX_QUEUED`;
workers share one listening socket and the kernel does not balance its connections evenly, so the queues
hold twice a fair share, and a step's burst queues instead of coming back as 429s. It listens on loopback
unless asked for another address, which needs a token (`case-env serve` refuses otherwise).
"""

from __future__ import annotations

import ipaddress
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

PER_WORKER = 512  # concurrent calls per worker before another is started (a worker answers ~1,000 calls/s)


def is_loopback(host: str) -> bool:
    """A bind address or URL host that only this machine reaches; a host name may resolve anywhere, so it
    counts as exposed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def only_here(url: str) -> bool:
    """A URL that reaches this machine only, wherever it is called: loopback, or the unspecified address
    (`http://0.0.0.0:8000` connects to the caller's own machine, a bind address is not a destination)."""
    host = httpx.URL(url).host
    if is_loopback(host):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def reachable(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def refuses(url: str, token: str | None) -> bool:
    """The server at `url` answers 401 to a call with `token` (or none)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return httpx.get(f"{url}/v1/tools", headers=headers, timeout=10).status_code == 401
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class Sizing:
    """Workers and per-worker queue of a server that must absorb `concurrency` calls at once."""

    workers: int
    max_queued: int

    @classmethod
    def for_concurrency(cls, concurrency: int, cores: int | None = None) -> Sizing:
        cores = cores or os.cpu_count() or 2
        workers = min(max(2, math.ceil(concurrency / PER_WORKER)), max(2, cores // 4))
        return cls(workers, max(1024, math.ceil(2 * concurrency / workers)))


def ensure_server(
    url: str,
    data_root: Path,
    sizing: Sizing = Sizing(2, 1024),
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
    timeout_s: float = 120,
) -> subprocess.Popen | None:
    """Start `case-env serve` when nothing answers at `url`; None when a server is already there. `host` is
    the bind address (the URL's host when it is a loopback one); `env` is added to the server's environment
    (its token, say)."""
    if reachable(url):
        token = (env or {}).get("CASE_ENV_TOKEN") or os.environ.get("CASE_ENV_TOKEN")
        if refuses(url, token):  # another server (another run's, with its token): every call would fail
            raise SystemExit(
                f"error: the case-env server at {url} refuses "
                f"{'this token' if token else 'calls without a token'} (401): set CASE_ENV_TOKEN to its "
                "token, or choose another --server-url"
            )
        return None
    parsed = httpx.URL(url)
    if is_loopback(host) and not is_loopback(parsed.host):
        raise SystemExit(f"no case-env server answers at {url}, and only a local one can be started")
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "case_env.cli", "serve", "--data-root", str(data_root)),
            *("--host", host, "--port", str(parsed.port or 8000), "--workers", str(sizing.workers)),
            *("--log-level", "warning"),
        ],
        env={**os.environ, "CASE_ENV_MAX_QUEUED": str(sizing.max_queued), **(env or {})},
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
