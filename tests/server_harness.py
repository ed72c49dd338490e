"""Run the real app under uvicorn on loopback, in a background thread, for tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from case_env.core import registry
from case_env.core.environment import Environment
from case_env.core.tools import ToolSpec
from case_env.server.app import create_app
from case_env.server.connections import PROTOCOL
from case_env.server.settings import ServerSettings
from case_env.settings import DataSettings


class LiveServer:
    def __init__(self, app, server: uvicorn.Server, thread: threading.Thread):
        self.app = app
        self.server = server
        self.thread = thread
        port = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    @property
    def state(self):
        return self.app.state.server


@contextmanager
def live_server(
    root: Path, tmp: Path, environments: list[Environment] | None = None, **settings
) -> Iterator[LiveServer]:
    server_settings = ServerSettings(host="127.0.0.1", port=0, audit_log=tmp / "audit.jsonl", **settings)
    data = DataSettings(data_root=root, cache_dir=tmp / "cache")
    with serve_app(create_app(server_settings, data, environments), http=PROTOCOL) as live:
        yield live


def with_tools(name: str, tools: dict[str, ToolSpec]) -> Environment:
    """A fresh instance of a registered environment serving `tools` instead of its own (a slow tool, a tool
    that counts its calls)."""
    env = type(registry.get(name))()
    env.tools = tools  # the instance's own value in place of the cached property
    return env


@contextmanager
def serve_app(app, http: str = "auto") -> Iterator[LiveServer]:
    """Any ASGI app under real uvicorn on a free loopback port (`http`: uvicorn's protocol setting; case-env's
    app runs with the one `case-env serve` gives it)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", http=http)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield LiveServer(app, server, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
