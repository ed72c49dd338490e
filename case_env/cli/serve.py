"""`case-env serve`: the tool server, its options as the settings its workers read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from case_env.cli.groups import app, fail
from case_env.core import registry
from case_env.core.text_cases import TextCases, cases_variable

if TYPE_CHECKING:
    from case_env.server.settings import ServerSettings
    from case_env.settings import DataSettings


def _case_files(cases: list[str]) -> dict[str, str]:
    """`ENV=PATH` pairs as the environment variables their environments read."""
    out: dict[str, list[str]] = {}
    for entry in cases:
        name, _, path = entry.partition("=")
        if not path:
            fail(f"--cases takes ENV=PATH, not {entry!r}", 2)
        try:
            env = registry.get(name)
        except registry.RegistryError as exc:
            fail(str(exc), 2)
        if not isinstance(env, TextCases):
            fail(f"the {name} environment reads its cases from the data root, not from --cases", 2)
        out.setdefault(cases_variable(name), []).append(str(Path(path).resolve()))
    return {key: os.pathsep.join(paths) for key, paths in out.items()}


def _case_files_given() -> bool:
    """Whether any environment that reads case files has them named (--cases, CASE_ENV_<ENV>_CASES)."""
    return any(
        os.environ.get(cases_variable(env.name))
        for env in registry.environments().values()
        if isinstance(env, TextCases)
    )


@app.command()
def serve(
    data_root: Path = typer.Option(
        None, "--data-root", help="Data root (CASE_ENV_DATA_ROOT) [default: data/synthetic]."
    ),
    host: str = typer.Option(None, "--host", help="Bind address (default 127.0.0.1; CASE_ENV_HOST)."),
    port: int = typer.Option(None, "--port", help="TCP port (default 8000; CASE_ENV_PORT)."),
    workers: int = typer.Option(
        None, "--workers", min=1, max=64, help="Worker processes (CASE_ENV_WORKERS) [default: 1]."
    ),
    audit_log: Path = typer.Option(
        None, "--audit-log", help="JSON-lines audit file (CASE_ENV_AUDIT_LOG) [default: none, no audit log]."
    ),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level."),
    access_log: bool = typer.Option(
        False,
        "--access-log/--no-access-log",
        help="uvicorn's line per request (off: the audit log records every call, and the line costs a "
        "cheap call a fifth of its server time).",
    ),
    replay: Path = typer.Option(
        None,
        "--replay",
        help="Serve recorded tool outputs from trajectory files (no data root needed) [default: none].",
    ),
    on_ray: bool = typer.Option(
        False, "--ray", help="Deploy as Ray Serve replicas (the cluster in RAY_ADDRESS, else a local Ray)."
    ),
    replicas: int = typer.Option(2, "--replicas", min=1, help="Ray Serve replicas (with --ray)."),
    cases: list[str] | None = typer.Option(
        None,
        "--cases",
        help="ENV=PATH: case files or directories of a text environment (CASE_ENV_<ENV>_CASES; default: "
        "<data root>/<env>/ when present). Repeat for more.",
    ),
    protocols: str = typer.Option(
        None,
        "--protocols",
        help="Doors to serve, comma-separated, from verl,openenv,mcp (default verl: the tool API alone; "
        "CASE_ENV_PROTOCOLS). openenv and mcp need their extras and start episodes from --bank rows.",
    ),
    banks: list[Path] | None = typer.Option(
        None,
        "--bank",
        help="A bank (parquet file or directory) the openenv and mcp doors serve rows of. Repeat for more [default: none].",
    ),
) -> None:
    """Run the tool server for every registered environment. With CASE_ENV_TOKEN set, /v1 routes and
    /metrics require `Authorization: Bearer`."""
    import tempfile

    _serve_options(data_root, host, port, workers, audit_log, replay, cases, protocols, banks)
    settings, data = _served_settings()
    with tempfile.TemporaryDirectory(prefix="case-env-") as run_dir:
        if on_ray:
            _serve_on_ray(settings, data, replicas, Path(run_dir))
            return
        _port_free(settings.host, settings.port)
        if settings.audit_log is None:
            typer.echo("audit log disabled (set CASE_ENV_AUDIT_LOG or --audit-log)", err=True)
        if settings.workers > 1:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = run_dir
        _serve_on_uvicorn(settings, log_level, access_log)


def _serve_on_uvicorn(settings: ServerSettings, log_level: str, access_log: bool) -> None:
    import uvicorn

    from case_env.server.connections import PROTOCOL

    uvicorn.run(
        "case_env.server.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=log_level,
        access_log=access_log,
        http=PROTOCOL,  # uvicorn's httptools with deadlines and a bounded head (server/connections.py)
        # the OpenEnv door's observations are mostly base64 PNG, which deflate cannot shrink: compressing
        # them cost a quarter of the door's server CPU (py-spy), for nothing on loopback or a cluster's LAN
        ws_per_message_deflate=False,
        # a door's frame past twice the largest body any route takes is dropped by uvicorn itself; below
        # that the door answers an oversized frame with its own error (server/doors/openenv.py)
        ws_max_size=2 * settings.max_score_body_bytes,
    )


def _serve_options(
    data_root: Path | None,
    host: str | None,
    port: int | None,
    workers: int | None,
    audit_log: Path | None,
    replay: Path | None,
    cases: list[str] | None,
    protocols: str | None,
    banks: list[Path] | None,
) -> None:
    """`serve`'s options as the CASE_ENV_* settings its workers (or Ray replicas) read."""
    overrides = {
        "DATA_ROOT": data_root,
        "HOST": host,
        "PORT": port,
        "WORKERS": workers,
        "AUDIT_LOG": audit_log,
        "REPLAY_DIR": replay,
    }
    for key, value in overrides.items():
        if value is not None:
            # workers and replicas are separate processes, maybe in another directory: pass settings down
            os.environ[f"CASE_ENV_{key}"] = str(value.resolve() if isinstance(value, Path) else value)
    os.environ.update(_case_files(cases or []))
    if protocols is not None:
        os.environ["CASE_ENV_PROTOCOLS"] = protocols.replace(" ", "")
    if banks:
        missing = [str(b) for b in banks if not b.exists()]
        if missing:
            fail(f"bank {missing[0]} does not exist (build one with `case-env bank build`)", 2)
        os.environ["CASE_ENV_BANKS"] = json.dumps([str(b.resolve()) for b in banks])


def _served_settings() -> tuple[ServerSettings, DataSettings]:
    """The server's and the data's settings, or a one-line refusal of what cannot be served."""
    from pydantic import ValidationError

    from case_env.core.problems import describe_errors
    from case_env.server.control import is_loopback
    from case_env.server.settings import ServerSettings
    from case_env.settings import DataSettings

    try:
        settings = ServerSettings()
    except ValidationError as exc:
        fail(f"invalid server setting: {describe_errors(exc.errors(include_url=False), ())}", 2)
    _check_doors(settings)
    data = DataSettings()
    if not is_loopback(settings.host) and settings.token is None:
        fail(
            f"refusing to listen on {settings.host} without a token: set CASE_ENV_TOKEN (or bind 127.0.0.1)",
            2,
        )
    if settings.audit_log is not None:
        from case_env.server.audit import problem

        wrong = problem(settings.audit_log)
        if wrong is not None:
            fail(f"audit log {settings.audit_log}: {wrong} (choose a writable file with --audit-log)", 2)
    if settings.episode_db is None:
        # episodes keep their case across a restart (a crash must not free a bound episode to name another)
        os.environ["CASE_ENV_EPISODE_DB"] = str(episode_db_for(data.cache_dir, settings.host, settings.port))
    if settings.replay_dir is not None:
        if not settings.replay_dir.exists():
            fail(f"replay source {settings.replay_dir} does not exist", 2)
    elif not data.data_root.is_dir() and not _case_files_given():
        # with case files given (--cases, CASE_ENV_<ENV>_CASES) the text environments serve without a root
        fail(
            f"data root {data.data_root} is not a directory (run `case-env synth`, set --data-root, or "
            "give case files with --cases)",
            2,
        )
    elif data.data_root.is_dir() and not any(data.data_root.iterdir()) and not _case_files_given():
        fail(
            f"data root {data.data_root} is empty: generate data there with `case-env synth --out "
            f"{data.data_root}`, or point --data-root at a data root",
            2,
        )
    return settings, data


def _port_free(host: str, port: int) -> None:
    """Refuse a port another process listens on now, before start-up (uvicorn would say only `[Errno 98]`)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as uvicorn binds: TIME_WAIT is no obstacle
        try:
            probe.bind((host, port))
        except OSError as exc:
            fail(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server holds it?); choose "
                "another port with --port or CASE_ENV_PORT",
                2,
            )


def _check_doors(settings) -> None:
    """The doors asked for can be served: their extras installed, one worker for MCP's sessions."""
    from case_env.server.doors import EXTRAS

    for door in settings.doors:
        try:
            __import__("openenv.core.env_server.http_server" if door == "openenv" else "mcp.server.lowlevel")
        except ImportError:
            fail(f"the {door} door needs its extra: pip install 'case-env[{EXTRAS[door]}]'", 2)
    if "mcp" in settings.doors and settings.workers > 1:
        fail("the mcp door keeps its sessions in one process: serve it with --workers 1", 2)
    if settings.doors and not settings.banks:
        print(
            f"note: the {' and '.join(settings.doors)} door(s) start episodes from bank rows: add --bank BANK"
        )


def episode_db_for(cache_dir: Path, host: str, port: int) -> Path:
    """Where `case-env serve` keeps its episodes by default: one file per address, in the cache directory."""
    return cache_dir / "episodes" / f"{host.replace(':', '_')}-{port}.sqlite"


def _serve_on_ray(settings, data, replicas: int, run_dir: Path) -> None:
    import signal
    import threading

    from case_env.server.ray_serve import deploy, settings_env

    os.environ.setdefault("CASE_ENV_DATA_ROOT", str(data.data_root.resolve()))
    os.environ.setdefault("CASE_ENV_CACHE_DIR", str(data.cache_dir.resolve()))
    shutdown = deploy(replicas, settings.host, settings.port, settings_env())
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    typer.echo(
        f"case-env on Ray Serve: {replicas} replica(s) at http://{settings.host}:{settings.port}", err=True
    )
    try:
        stop.wait()
    finally:
        shutdown()
