"""Doors: the protocols other trainers and clients speak, served beside the tool API on the same server.

A door is an optional extra, off unless `--protocols` names it; each reaches the tools through the tool
route (`episodes.py`), so scope, limits, audit, metrics, the episode log and the reward are the API's own.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from case_env.core.environment import Environment
from case_env.server.settings import ServerSettings

EXTRAS = {"openenv": "openenv", "mcp": "mcp"}  # door -> the extra that brings its dependencies


class DoorUnavailableError(RuntimeError):
    """A door was asked for whose extra is not installed."""


def install(app: FastAPI, settings: ServerSettings, hosted: dict[str, Environment]) -> list:
    """Mount the doors the settings name; returns what the lifespan runs (OpenEnv apps, MCP servers)."""
    mounted: list = []
    for door in settings.doors:
        try:
            module = importlib.import_module(f"case_env.server.doors.{door}")
        except ModuleNotFoundError as exc:  # a module missing, not a name moved inside one
            raise DoorUnavailableError(
                f"the {door} door needs its extra ({exc.name} is missing): pip install 'case-env[{EXTRAS[door]}]'"
            ) from None
        mounted += module.install(app, hosted, settings)
    if mounted:
        from case_env.server.doors import rows

        app.include_router(rows.router)  # the rows a door's client lists before it starts episodes
    return mounted


@contextlib.asynccontextmanager
async def running(
    app: FastAPI, settings: ServerSettings, hosted: dict[str, Environment], mounted: list
) -> AsyncIterator[None]:
    """The doors' part of the lifespan: the banks' rows loaded, OpenEnv's reapers and MCP's sessions run."""
    if not mounted:
        yield
        return
    from case_env.server.doors.episodes import Rows

    app.state.door_rows = Rows.load(settings.banks, hosted)
    async with contextlib.AsyncExitStack() as stack:
        for door in mounted:
            if isinstance(door, FastAPI):  # OpenEnv's server registers its reaper as start-up handlers
                for handler in door.router.on_startup:
                    await handler()
                for handler in door.router.on_shutdown:
                    stack.push_async_callback(handler)
            else:
                await stack.enter_async_context(door.running())
        yield
