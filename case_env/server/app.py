"""The app factory: settings in, a FastAPI app out, with its resources opened and closed by the lifespan.

`create_app()` with no arguments reads `CASE_ENV_*` settings, which is how uvicorn workers build it
(`case_env.server.app:create_app`, factory mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import time
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from case_env import __version__
from case_env.core import registry
from case_env.core.environment import Environment
from case_env.core.problems import describe_errors
from case_env.core.tools import ErrorCode
from case_env.server import contract, doors
from case_env.server.admission import Admission
from case_env.server.audit import AuditLog
from case_env.server.auth import TokenGate
from case_env.server.errors import INTERNAL_MESSAGE, error_response, short
from case_env.server.limits import BodyLimit
from case_env.server.metrics import Metrics
from case_env.server.replay import ReplayBook
from case_env.server.responses import ResponseCache
from case_env.server.routes import episodes, ops, score, tools
from case_env.server.settings import ServerSettings
from case_env.server.state import ServerState
from case_env.server.store import open_store
from case_env.settings import DataSettings

log = logging.getLogger("case_env.server")

DESCRIPTION = """Case-scoped tools for clinical agents that gather evidence before they answer, one set per
environment (`GET /v1/tools` lists them).

Model-caused problems (bad arguments, an unknown tool, a case detail that does not exist) return `ok: false` with a message the
model can act on; service problems use HTTP status codes (429, 503, 504) that clients retry."""


async def _tick(state: ServerState) -> None:
    # every quarter second: the calls' metrics are published and the sampled gauges refreshed (writing the
    # shared metric files on every call cost more than the rest of a cheap call's bookkeeping)
    while True:
        await asyncio.sleep(0.25)
        try:
            state.metrics.publish()
            state.note_gauges()
        except Exception:  # a failed publish must not end the loop
            log.exception("metrics publish failed")


async def _sweep_episodes(state: ServerState) -> None:
    interval = min(60.0, state.settings.episode_idle_s / 4)
    while True:
        await asyncio.sleep(interval)
        try:
            now = time.time()
            await state.store.sweep(now)
            state.metrics.episodes_live.set(await state.store.live(now))
        except Exception as exc:  # a failed sweep (the store down a moment) must not end the loop
            log.warning("episode sweep failed: %s", exc)


def raise_open_file_limit(wanted: int = 65536) -> int:
    """Raise this process's soft limit on open files toward the hard limit; returns the new soft limit.

    Each memory-mapped volume holds a file descriptor (CPython's mmap keeps a duplicate until 3.13), so a
    large decoded-volume cache plus many client connections can pass the common default of 1,024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
    return soft


def _hosted(environments: Iterable[Environment] | None) -> tuple[dict[str, Environment], dict[str, str]]:
    """The environments this app serves (every registered one by default), and each tool's environment;
    tool names must not clash."""
    hosted = (
        {env.name: env for env in environments} if environments is not None else dict(registry.environments())
    )
    owners = registry.tool_owners(hosted.values())
    return hosted, owners


def create_app(
    settings: ServerSettings | None = None,
    data: DataSettings | None = None,
    environments: Iterable[Environment] | None = None,
) -> FastAPI:
    """`environments` chooses what the app serves (default: every registered one; a benchmark may pass an
    environment with another data engine, tests one with more tools); everything else comes from the settings."""
    settings = settings or ServerSettings()
    data = data or DataSettings()
    hosted, tool_env = _hosted(environments)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = _open_state(settings, data, hosted, tool_env)
        if settings.audit_log is None:  # `case-env serve` says it once for all its workers
            log.info("audit log disabled (set CASE_ENV_AUDIT_LOG or --audit-log)")
        app.state.server = state
        # what start-up built (modules, schemas, cases) lives as long as the worker: keep it out of the
        # collector's full passes, which otherwise walk it again and again under load
        gc.collect()
        gc.freeze()
        state.tasks.append(asyncio.create_task(_sweep_episodes(state)))
        state.tasks.append(asyncio.create_task(_tick(state)))
        try:
            async with doors.running(app, settings, hosted, mounted):
                yield
        finally:
            await _close_state(state)

    app = FastAPI(
        title="case-env",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        # no 307 from /v1/tools/x/ to /v1/tools/x: Starlette built its Location from the request's Host header
        redirect_slashes=False,
        **_telemetry(settings),
    )
    # ours, not FastAPI's `max_body_size`: Starlette's limit answers a body over it with its own plain-text
    # 413, replacing any JSON answer the app makes, where every refusal here is `{ok, error}`
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, per_path={"/v1/score": settings.max_score_body_bytes}
    )
    app.add_middleware(TokenGate)  # added last, so outermost: the token before the body limit and validation
    app.include_router(tools.router)  # the hot route first: routes are matched in order
    app.include_router(ops.router)
    app.include_router(episodes.router)
    app.include_router(score.router)
    mounted = doors.install(app, settings, hosted)
    _install_error_handlers(app)
    contract.install(app, hosted, tool_env)
    return app


def _open_state(
    settings: ServerSettings, data: DataSettings, hosted: dict[str, Environment], tool_env: dict[str, str]
) -> ServerState:
    """A worker's state: its cases (or the replayed calls), its logs, caches, admission and pools."""
    raise_open_file_limit()
    specs = {name: spec for env in hosted.values() for name, spec in env.tools.items()}
    replay = ReplayBook.load(settings.replay_dir, specs) if settings.replay_dir else None
    cases = {}
    if replay is not None:
        specs = replay.bind(specs)
        log.info(
            "replay: %d recorded calls for %d cases from %s",
            len(replay.entries),
            len(replay.cases),
            settings.replay_dir,
        )
    else:
        for name, env in hosted.items():
            cases[name] = env.open_cases(data)
            problems = cases[name].problems
            log.info(
                "%s: %d cases, %d problem(s) under %s",
                name,
                len(cases[name].ids()),
                len(problems),
                data.data_root,
            )
            for line in problems.shown():
                log.warning("%s data problem: %s", name, line)
    return ServerState(
        settings=settings,
        data=data,
        environments=hosted,
        cases=cases,
        tools=specs,
        tool_env=tool_env,
        replay=replay,
        store=open_store(
            settings.store,
            settings.episode_db,
            settings.episode_idle_s,
            settings.max_episodes,
            settings.max_calls_per_episode,
        ),
        audit=AuditLog(settings.audit_log),
        responses=ResponseCache(settings.response_cache_mb * 2**20),
        admission=Admission(settings.max_in_flight, settings.max_queued, settings.queue_wait_s),
        awaiting=Admission(settings.max_awaiting, 0, 0.0),
        metrics=Metrics(),
        render_pool=ThreadPoolExecutor(settings.render_threads, thread_name_prefix="case-env-render"),
        text_pool=ThreadPoolExecutor(settings.text_threads, thread_name_prefix="case-env-text"),
        preload_pool=ThreadPoolExecutor(1, thread_name_prefix="case-env-warm")
        if settings.warm_patients
        else None,
    )


async def _close_state(state: ServerState) -> None:
    for task in state.tasks:
        task.cancel()
    for pool in (state.render_pool, state.text_pool, state.preload_pool):
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    state.metrics.publish()
    await state.store.close()
    state.audit.close()


def _telemetry(settings: ServerSettings) -> dict:
    """FastAPI's native OpenTelemetry (FastAPI 0.165 and later) off unless `otel` asks for it; older FastAPI
    has none to turn off."""
    if settings.otel or "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message = short("invalid request: " + describe_errors(exc.errors()))
        request.app.state.server.audit.refusal(
            request.method, request.url.path, ErrorCode.INVALID_REQUEST.value, 422
        )
        return error_response(ErrorCode.INVALID_REQUEST, message, status=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot decode (not UTF-8): the same 422 as any bad body, audited alike
            request.app.state.server.audit.refusal(
                request.method, request.url.path, ErrorCode.INVALID_REQUEST.value, 422
            )
            return error_response(
                ErrorCode.INVALID_REQUEST, "invalid request: the body is not valid JSON", status=422
            )
        code = ErrorCode.INVALID_REQUEST if exc.status_code < 500 else ErrorCode.INTERNAL
        return error_response(code, short(str(exc.detail)), status=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        # Starlette raises the error again once this answer is sent, and uvicorn then closes the connection:
        # the answer says so, so that a keep-alive client opens a new one instead of meeting a reset
        return error_response(
            ErrorCode.INTERNAL, INTERNAL_MESSAGE, status=500, headers={"Connection": "close"}
        )
