"""A stand-in for an OpenAI-compatible model server (a simulated patient, a judge), for benchmarks and tests.

`POST /v1/chat/completions` answers after `--latency-ms` (every request, however many are waiting: a model
server with room for all of them) with one chat completion whose content is `--reply`; a share
`--failure-rate` of requests get a 500 instead, after the same wait. `GET /stats` gives what it saw: requests,
failures, the most in flight at once. It reads nothing of the request beyond its length, so its own CPU per
request stays a small fraction of the server's it stands beside. Loopback only: it is a measuring device, not
a model.

    python -m case_env.bench.standin --port 8101 --latency-ms 300 --failure-rate 0.1 --reply "yes"
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Annotated

import httpx
import typer

from case_env.bench.process import free_port
from case_env.core.commands import run
from case_env.server.control import is_loopback

MAX_BODY = 64 * 2**20


@dataclass
class Seen:
    requests: int = 0
    failures: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0


class StandIn:
    def __init__(self, latency_s: float, failure_rate: float, reply: str, seed: int = 0):
        self.latency_s = latency_s
        self.failure_rate = failure_rate
        self.rng = random.Random(seed)
        self.seen = Seen()
        document = {
            "id": "standin",
            "object": "chat.completion",
            "model": "standin",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
            ],
        }
        self.ok = _response(200, json.dumps(document).encode())
        self.failed = _response(500, b'{"error": {"message": "stand-in failure"}}')

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *headers = head.decode("latin-1").split("\r\n")
                length = 0
                for header in headers:
                    name, _, value = header.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length > MAX_BODY:
                    return
                if length:
                    await reader.readexactly(length)
                writer.write(await self.answer(line))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def answer(self, line: str) -> bytes:
        method, path = [*line.split(" "), "", ""][:2]
        if method == "GET" and path == "/stats":
            return _response(200, json.dumps(asdict(self.seen)).encode())
        if method != "POST" or not path.endswith("/chat/completions"):
            return _response(404, b'{"error": {"message": "not found"}}')
        seen = self.seen
        seen.requests += 1
        seen.in_flight += 1
        seen.peak_in_flight = max(seen.peak_in_flight, seen.in_flight)
        try:
            await asyncio.sleep(self.latency_s)
        finally:
            seen.in_flight -= 1
        if self.rng.random() < self.failure_rate:
            seen.failures += 1
            return self.failed
        return self.ok


def _response(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _main(host: str, port: int, standin: StandIn) -> None:
    server = await asyncio.start_server(standin.serve, host, port, backlog=4096)
    async with server:
        await server.serve_forever()


class StandInProcess:
    """A stand-in in its own process, for as long as the `with` block."""

    def __init__(self, latency_ms: float = 0.0, failure_rate: float = 0.0, reply: str = "yes", seed: int = 0):
        self.port = free_port()
        self.argv = [
            sys.executable,
            "-m",
            "case_env.bench.standin",
            "--port",
            str(self.port),
            "--latency-ms",
            str(latency_ms),
            "--failure-rate",
            str(failure_rate),
            "--reply",
            reply,
            "--seed",
            str(seed),
        ]
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The base URL a client is given (OpenAI's `/v1`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.port}/stats", timeout=5).json()

    def __enter__(self) -> StandInProcess:
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                self.stats()
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"the stand-in exited with {self.process.returncode}")
            time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("the stand-in did not answer within 30 s")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def main(
    host: Annotated[str, typer.Option(help="Loopback address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8101,
    latency_ms: Annotated[float, typer.Option(help="Wait before every answer.")] = 0.0,
    failure_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of requests answered 500.")
    ] = 0.0,
    reply: Annotated[str, typer.Option(help="The content of every completion.")] = "yes",
    seed: Annotated[int, typer.Option(help="Seeds which requests fail.")] = 0,
) -> None:
    """An OpenAI-compatible stand-in model server on loopback."""
    if not is_loopback(host):
        raise typer.BadParameter(
            f"{host} is not a loopback address; the stand-in serves loopback only", param_hint="--host"
        )
    asyncio.run(_main(host, port, StandIn(latency_ms / 1000, failure_rate, reply, seed)))


if __name__ == "__main__":
    run(main)
