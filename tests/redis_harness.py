"""A real `redis-server` (Debian's package, which `make test` installs) on a free loopback port, in a folder
of its own, with append-only persistence so that a restart keeps what it held."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from case_env.bench.process import free_port


class RedisServer:
    def __init__(self, folder: Path, port: int | None = None):
        self.folder = folder
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (make test installs Debian's redis-server)"
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
        deadline = time.monotonic() + 20
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {self.folder / 'redis.log'}") from None
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        """A clean shutdown: Redis writes what it holds (append-only file) before it exits."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def flush(self) -> None:
        with contextlib.closing(redis.Redis(host="127.0.0.1", port=self.port)) as client:
            client.flushall()


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[RedisServer]:
    server = RedisServer(folder).start()
    try:
        yield server
    finally:
        server.kill()
