"""The server (and a Redis for its episodes) as child processes: what benchmarks and reliability checks
need and a thread cannot give.

A server in a thread of the caller shares its interpreter, so it cannot be killed with SIGKILL, its memory
and file descriptors cannot be told apart from the caller's, and the two fight over one GIL. Here the server
runs in its own process group (uvicorn workers included), its output goes to a log file that checks can
read (for example to prove no token was written), and it can be killed and started again on the same port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(
    server: subprocess.Popen,
    url: str,
    seconds: float = 90.0,
    log: Path | None = None,
    token: str | None = None,
) -> None:
    """Poll /readyz of a server started as `server` until it answers 200; fail fast if the process exits.
    `token`: the server's bearer token, which /readyz asks for when one is set."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + seconds
    while True:
        if server.poll() is not None:
            output = server.stderr or server.stdout
            text = log.read_text(errors="replace") if log else (output.read() if output else "")
            raise RuntimeError(f"server exited with {server.returncode}: {text[-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("server did not become ready")
        time.sleep(0.1)


class ServerProcess:
    """`case-env serve` with the given `CASE_ENV_*` settings, on loopback, in its own process group.

    `env` entries override the inherited environment; a value of None removes the variable (so a token or
    audit log set in the caller's shell does not leak into a check)."""

    def __init__(
        self,
        log: Path,
        env: dict[str, str | None],
        port: int | None = None,
        command: list[str] | None = None,
        log_level: str = "warning",
    ):
        self.port = port or free_port()
        self.log = log
        self.command = command or [sys.executable, "-m", "case_env.cli", "serve", "--log-level", log_level]
        self.env = {**os.environ}
        for key, value in {"CASE_ENV_HOST": "127.0.0.1", "CASE_ENV_PORT": str(self.port), **env}.items():
            if value is None:
                self.env.pop(key, None)
            else:
                self.env[key] = value
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self, ready_s: float = 90.0) -> ServerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as out:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_ready(self.process, self.url, ready_s, log=self.log, token=self.env.get("CASE_ENV_TOKEN"))
        return self

    def kill(self) -> None:
        """SIGKILL to the whole group: no shutdown handler, no flush, as a crash or the OOM killer would."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class RedisServer:
    """A real `redis-server` (Debian's package) on a free loopback port, in a folder of its own, with
    append-only persistence so that a restart keeps what it held: the shared episode store of a
    benchmark's or a check's replicas."""

    def __init__(self, folder: Path, port: int | None = None):
        self.folder = folder
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self, ready_s: float = 20.0) -> RedisServer:
        import redis

        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                *(binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder)),
                *("--appendonly", "yes", "--appendfsync", "always", "--save", ""),
                *("--daemonize", "no", "--logfile", str(self.folder / "redis.log")),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + ready_s
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"redis-server did not start: see {self.folder / 'redis.log'}"
                        ) from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        """A clean shutdown: Redis writes what it holds (its append-only file) before it exits."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def flush(self) -> None:
        import redis

        with contextlib.closing(redis.Redis(host="127.0.0.1", port=self.port)) as client:
            client.flushall()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()
