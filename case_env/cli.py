"""The `case-env` command line.

Every verb works on any registered environment (`case-env envs` lists them); what differs between
environments comes from their option models and hooks, and each may add its own commands (under
`case-env bench`, say). Expected failures (bad data, a directory we must not
overwrite, an unknown option value) print one clear line per problem and exit non-zero; anything
unexpected prints a one-line internal error instead of a traceback, unless CASE_ENV_DEBUG=1 asks for it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from case_env import __version__
from case_env.cli_options import options_command
from case_env.core import registry
from case_env.core.commands import plain_app
from case_env.core.errors import CommandError
from case_env.core.parts import (
    Banks,
    Baselines,
    Benchmarks,
    Commands,
    DataChecks,
    ServerBenchOptions,
    Synthesis,
    evaluation_of,
)
from case_env.core.problems import Problems
from case_env.core.text_cases import TextCases, cases_variable
from case_env.trl.commands import model_app, trl_app

if TYPE_CHECKING:
    from case_env.server.settings import ServerSettings
    from case_env.settings import DataSettings

app = plain_app(
    help="case-env: RL environment server for clinical agents that gather evidence with tools.",
    no_args_is_help=True,
)
data_app = typer.Typer(help="Inspect and validate a data root.", no_args_is_help=True)
bank_app = typer.Typer(help="Build and validate banks in the CASE parquet schema.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Benchmarks (figures are ratios and timings measured in one run).", no_args_is_help=True
)
traj_app = typer.Typer(help="Work with recorded trajectories.", no_args_is_help=True)
train_app = typer.Typer(
    help="Training on GPUs with verl: check a run before it starts, then start it.", no_args_is_help=True
)
app.add_typer(data_app, name="data")
app.add_typer(bank_app, name="bank")
app.add_typer(bench_app, name="bench")
app.add_typer(traj_app, name="traj")
app.add_typer(train_app, name="train")
train_app.add_typer(trl_app, name="trl")
app.add_typer(model_app, name="model")
GROUPS = {
    "root": app,
    "data": data_app,
    "bank": bank_app,
    "bench": bench_app,
    "traj": traj_app,
    "train": train_app,
}
# `case-env train` passes its arguments to the launcher's own parser (scripts/train_grpo.sh takes the same),
# whose --help lists them; unknown ones are Hydra overrides for verl
_LAUNCHER_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def _fail(message: str, code: int = 1) -> None:
    raise CommandError(message, code)


@app.command()
def version() -> None:
    """Print the package version."""
    typer.echo(__version__)


@app.command()
def envs(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON document."),
    verbose: bool = typer.Option(False, "--verbose", help="Also the optional parts each environment has."),
) -> None:
    """List every registered environment: its personas (with their data sources) and tools."""
    listed = {
        env.name: {
            "title": env.title,
            "summary": env.summary,
            "personas": {name: list(p.data_sources) for name, p in env.personas.items()},
            "tools": list(env.tools),
            "data_sources": list(env.personas.data_sources),
            "agents": list(env.baselines) if isinstance(env, Baselines) else [],
            "parts": [part.__name__ for part in registry.PARTS if isinstance(env, part)],
            "protocols": list(evaluation_of(env).protocols),
            "default": env.default,
        }
        for env in registry.environments().values()
    }
    if as_json:
        typer.echo(json.dumps({"environments": listed, "problems": list(registry.problems())}, indent=2))
        return
    import textwrap

    def field(label: str, text: str) -> None:
        typer.echo(textwrap.fill(text, 100, initial_indent=f"  {label}: ", subsequent_indent="    "))

    for name, env in listed.items():
        typer.echo(textwrap.fill(f"{name}{' (default)' if env['default'] else ''}: {env['summary']}", 100))
        field("personas", ", ".join(f"{p} ({', '.join(s)})" for p, s in env["personas"].items()))
        field(f"tools ({len(env['tools'])})", ", ".join(env["tools"]))
        field("scripted agents", ", ".join(env["agents"]) or "-")
        if verbose:
            field("parts", ", ".join(env["parts"]) or "-")
        if env["protocols"]:
            field("eval protocols", f"{', '.join(env['protocols'])} (the first the default)")
    for problem in registry.problems():
        typer.echo(f"problem: {problem}", err=True)


def _synth(env, options) -> None:
    env.synthesize(options, typer.echo)


options_command(
    app,
    "synth",
    "Generate deterministic synthetic data for an environment.",
    Synthesis,
    lambda env: env.synth_options,
    _synth,
)


def _case_files(cases: list[str]) -> dict[str, str]:
    """`ENV=PATH` pairs as the environment variables their environments read."""
    out: dict[str, list[str]] = {}
    for entry in cases:
        name, _, path = entry.partition("=")
        if not path:
            _fail(f"--cases takes ENV=PATH, not {entry!r}", 2)
        try:
            env = registry.get(name)
        except registry.RegistryError as exc:
            _fail(str(exc), 2)
        if not isinstance(env, TextCases):
            _fail(f"the {name} environment reads its cases from the data root, not from --cases", 2)
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

    import uvicorn

    from case_env.server.connections import PROTOCOL

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
            _fail(f"bank {missing[0]} does not exist (build one with `case-env bank build`)", 2)
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
        _fail(f"invalid server setting: {describe_errors(exc.errors(include_url=False), ())}", 2)
    _check_doors(settings)
    data = DataSettings()
    if not is_loopback(settings.host) and settings.token is None:
        _fail(
            f"refusing to listen on {settings.host} without a token: set CASE_ENV_TOKEN (or bind 127.0.0.1)",
            2,
        )
    if settings.audit_log is not None:
        from case_env.server.audit import problem

        wrong = problem(settings.audit_log)
        if wrong is not None:
            _fail(f"audit log {settings.audit_log}: {wrong} (choose a writable file with --audit-log)", 2)
    if settings.episode_db is None:
        # episodes keep their case across a restart (a crash must not free a bound episode to name another)
        os.environ["CASE_ENV_EPISODE_DB"] = str(episode_db_for(data.cache_dir, settings.host, settings.port))
    if settings.replay_dir is not None:
        if not settings.replay_dir.exists():
            _fail(f"replay source {settings.replay_dir} does not exist", 2)
    elif not data.data_root.is_dir() and not _case_files_given():
        # with case files given (--cases, CASE_ENV_<ENV>_CASES) the text environments serve without a root
        _fail(
            f"data root {data.data_root} is not a directory (run `case-env synth`, set --data-root, or "
            "give case files with --cases)",
            2,
        )
    elif data.data_root.is_dir() and not any(data.data_root.iterdir()) and not _case_files_given():
        _fail(
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
            _fail(
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
            _fail(f"the {door} door needs its extra: pip install 'case-env[{EXTRAS[door]}]'", 2)
    if "mcp" in settings.doors and settings.workers > 1:
        _fail("the mcp door keeps its sessions in one process: serve it with --workers 1", 2)
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


@data_app.command("check")
def data_check(
    root: Path = typer.Argument(..., help="Data root to validate."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON document instead of tables."),
) -> None:
    """Validate a data root for every environment with data in it (exit 1 on problems)."""
    summary: dict = {}
    errors: list[str] = []
    warnings: list[str] = []
    lines: list[str] = []
    for env in registry.environments().values():
        found = env.check_data(root) if isinstance(env, DataChecks) else None
        if found is None:
            continue
        summary.update(found.summary)
        lines += found.lines
        errors += found.errors
        warnings += found.warnings
    if not lines and not errors:
        errors.append(
            f"data root {root} holds no data of any environment (run `case-env synth --env ENV --out {root}`)"
        )
    if as_json:
        typer.echo(json.dumps({**summary, "problems": errors, "warnings": warnings}, indent=2))
    else:
        for line in lines:
            typer.echo(line)
        for warning in warnings:
            typer.echo(f"warning: {warning}", err=True)
        for problem in errors:
            typer.echo(f"problem: {problem}", err=True)
        typer.echo(f"check: {'ok' if not errors else f'{len(errors)} problem(s)'}")
    if errors:
        raise typer.Exit(1)


@app.command("verl-config")
def verl_config(
    out: Path = typer.Option(Path("configs/verl"), "--out", help="Directory for the tool YAML files."),
    env: list[str] | None = typer.Option(None, "--env", help="Only these environments (default: all)."),
) -> None:
    """Write verl's tool config of each environment (<out>/<env>.yaml: one CaseTool entry per tool)."""
    from case_env.verl.config import write_all

    try:
        for path in write_all(out, env or None):
            typer.echo(f"wrote {path}")
    except registry.RegistryError as exc:
        _fail(str(exc), 2)


@app.command()
def rollouts(
    bank: Path = typer.Option(Path("data/bank"), "--bank", help="Bank directory."),
    split: str = typer.Option("test", "--split", help="Which split's rows to roll out."),
    server_url: str = typer.Option(
        "http://127.0.0.1:8765", "--server-url", help="case-env server (started if absent)."
    ),
    data_root: Path = typer.Option(
        Path("data/synthetic"), "--data-root", help="Data root for a started server."
    ),
    per_source: int = typer.Option(8, "--per-source", min=1, help="Rows per data source."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Trajectories in flight."),
    form: str = typer.Option(
        "hermes", "--format", help="Tool-call format of the model and verl's parser: hermes or qwen3_coder."
    ),
    model: str = typer.Option(
        None,
        "--model",
        help="A language model generating on this machine (a Hugging Face directory, or smollm2) instead of "
        "the scripted baseline (needs the model extra) [default: none, the scripted baseline].",
    ),
    temperature: float = typer.Option(
        0.0, "--temperature", min=0.0, help="The model's sampling temperature."
    ),
    seed: int = typer.Option(0, "--seed", help="The model's sampling seed."),
    response_length: int = typer.Option(
        2048, "--response-length", min=16, help="verl's response budget of a trajectory, in tokens."
    ),
    max_turns: int = typer.Option(8, "--max-turns", min=1, help="The model's assistant turns per row."),
    out: Path = typer.Option(
        None,
        "--out",
        help="Write rollouts.json and every turn (turns.jsonl) here [default: none, not written].",
    ),
) -> None:
    """Roll a bank's rows out through verl's agent loops, scored by verl's reward manager: the environment's
    scripted baseline, or a model generating on this machine (--model). Needs verl."""
    from case_env.core.bank import BankError, read_bank, split_file
    from case_env.core.calls import FORMATS
    from case_env.server.control import ensure_server, stop

    if form not in FORMATS:
        _fail(f"unknown tool-call format {form!r}; choose {' or '.join(FORMATS)}", 2)
    try:
        parquet = split_file(bank, split)
        read_bank(parquet, columns=["data_source"])  # a broken file refused now, as eval refuses it
    except (FileNotFoundError, BankError) as exc:
        _fail(str(exc), 2)
    if model is not None:
        from case_env.trl.commands import model_dir

        model = model_dir(model)
    server = ensure_server(server_url, data_root)
    try:
        if model is None:
            from case_env.verl.rollouts import run_rollouts

            summary = run_rollouts(parquet, server_url, per_source, concurrency, form)
        else:
            from case_env.verl.model_rollouts import ModelRun, run_model_rollouts

            run = ModelRun(
                model,
                temperature,
                seed=seed,
                response_length=response_length,
                max_turns=max_turns,
                form=form,
            )
            summary = run_model_rollouts(parquet, server_url, per_source, concurrency, run, out)
    finally:
        stop(server)
    _rollouts_table(summary, model is not None)


def _rollouts_table(summary: dict, model: bool) -> None:
    header = f"{'data source':18s} {'n':>4s} {'reward':>7s} {'accuracy':>9s} {'format ok':>10s} {'calls':>6s} {'ok':>5s} {'infra':>6s}"
    if model:
        header += f" {'turns':>6s} {'call turns':>11s} {'misparsed':>10s} {'tokens/turn':>12s} {'crashes':>8s}  floors"
    typer.echo(header)
    for source, s in summary.items():
        if not s.n:
            continue
        line = (
            f"{source:18s} {s.n:4d} {s.reward / s.n:7.2f} {s.correct / s.n:9.2f} {s.format_ok / s.n:10.2f} "
            f"{s.tool_calls / s.n:6.1f} {s.calls_ok / s.n:5.1f} {s.infra_errors:6d}"
        )
        if model:
            per_turn = s.tokens / s.turns if s.turns else 0.0
            floors = ", ".join(f"{k} {v:.2f}" for k, v in s.floors.items()) or "-"
            line += f" {s.turns / s.n:6.1f} {s.call_turns / max(s.turns, 1):11.2f} {s.misparsed:10d} {per_turn:12.1f} {s.crashes:8d}  {floors}"
        typer.echo(line)


@train_app.command("preflight", context_settings=_LAUNCHER_ARGS, add_help_option=False)
def train_preflight(ctx: typer.Context) -> None:
    """Check a training run before it starts (exit 2 when a check fails; --help lists the options)."""
    from case_env.verl import grpo

    raise typer.Exit(grpo.main(ctx.args, preflight_only=True))


@train_app.command("run", context_settings=_LAUNCHER_ARGS, add_help_option=False)
def train_run(ctx: typer.Context) -> None:
    """Start a GRPO run on verl after the preflight, as scripts/train_grpo.sh does (--help: options)."""
    from case_env.verl import grpo

    raise typer.Exit(grpo.main(ctx.args))


@app.command("eval")
def eval_(
    bank: Path = typer.Option(
        ..., "--bank", help="A bank parquet file, or a bank directory (all its splits)."
    ),
    server_url: str = typer.Option(..., "--server", help="Base URL of a running case-env server."),
    agent: str = typer.Option(
        ..., "--agent", help="openai, or one of the bank environment's scripted agents."
    ),
    out: Path = typer.Option(
        ..., "--out", help="Directory for trajectories.jsonl, images/, results.json, report.html."
    ),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="Rollouts in flight."),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Only the first N rows [default: every row]."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue a run in --out, skipping finished rollouts."
    ),
    token: str | None = typer.Option(
        None, "--token", envvar="CASE_ENV_TOKEN", help="Bearer token of the server [default: none]."
    ),
    repeats: int = typer.Option(
        1, "--repeats", min=1, help="Rollouts per row; figures are means over all of them."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the stochastic scripted agents' draws."),
    model_url: str | None = typer.Option(
        None,
        "--model-url",
        help="openai agent: base URL of an OpenAI-compatible server, e.g. http://host:8000/v1 [default: none].",
    ),
    model_name: str | None = typer.Option(
        None, "--model", help="openai agent: model name to request [default: none]."
    ),
    api_key: str = typer.Option("EMPTY", "--api-key", envvar="OPENAI_API_KEY", help="openai agent: API key."),
    max_turns: int | None = typer.Option(
        None, "--max-turns", min=1, help="Assistant turns per rollout (default: the environment's)."
    ),
    call_timeout: float = typer.Option(
        120.0, "--call-timeout", min=1.0, help="openai agent: seconds per completion."
    ),
    temperature: float | None = typer.Option(
        None,
        "--temperature",
        min=0.0,
        help="openai agent: sampling temperature (default: the environment's for independent samples, "
        "0.6 for case reasoning; 0 for everything else).",
    ),
    max_tokens: int = typer.Option(
        2048, "--max-tokens", min=1, help="openai agent: tokens of one completion [default: 2048]."
    ),
    greedy_samples: bool = typer.Option(
        False,
        "--greedy-samples",
        help="Allow --temperature 0 with several independent samples per row (they are then identical).",
    ),
    protocol: str | None = typer.Option(
        None,
        "--protocol",
        help="The bank environment's evaluation protocol, as `case-env envs` lists them (default: its first).",
    ),
) -> None:
    """Evaluate a policy over a bank against a live server; prints the environment's summary."""
    import httpx
    from openai import APIError, APITimeoutError

    from case_env.core.trajectory import TrajectoryFormatError
    from case_env.eval.openai_agent import ModelSettings
    from case_env.eval.runner import OPENAI, run_eval

    known = {
        a for env in registry.environments().values() if isinstance(env, Baselines) for a in env.baselines
    } | {OPENAI}
    if agent not in known:
        _fail(f"unknown agent {agent!r}; choose one of {', '.join(sorted(known))}", 2)
    model = None
    if agent == OPENAI:
        if not model_url or not model_name:
            _fail("the openai agent needs --model-url and --model", 2)
        model = ModelSettings(
            base_url=model_url,
            model=model_name,
            api_key=api_key,
            max_turns=max_turns,
            timeout_s=call_timeout,
            temperature=temperature,
            max_tokens=max_tokens,
        )
    try:
        results = run_eval(
            bank,
            server_url,
            agent,
            out,
            concurrency,
            limit,
            resume,
            token,
            model=model,
            repeats=repeats,
            seed=seed,
            max_turns=max_turns,
            greedy_samples=greedy_samples,
            protocol=protocol,
        )
    except (FileNotFoundError, FileExistsError, LookupError, TrajectoryFormatError, ValueError) as exc:
        _fail(str(exc), 2)
    except httpx.HTTPError as exc:
        _fail(f"server {server_url} failed: {exc}", 1)
    except APIError as exc:  # the model's server, not a row: what finished is kept for --resume
        slow = isinstance(exc, APITimeoutError)
        _fail(
            f"the model server {model_url} failed: {exc} (a completion may take --call-timeout {call_timeout:g} s, "
            f"tried 3 times); the finished rows are kept in {out}: run again with --resume"
            + (" and a larger --call-timeout" if slow else ""),
            1,
        )
    for line in evaluation_of(registry.get(results["env"])).summary_lines(results):
        typer.echo(line)
    typer.echo(f"wrote {out / 'results.json'}, {out / 'report.html'} and {out / 'trajectories.jsonl'}")


@bench_app.command("model")
def bench_model(
    model: str = typer.Option(
        "smollm2", "--model", help="A Hugging Face model directory, or smollm2 [default: smollm2]."
    ),
    out: Path = typer.Option(
        Path("bench-out/model"), "--out", help="Where model.json goes [default: bench-out/model]."
    ),
    prompt_tokens: int = typer.Option(512, "--prompt-tokens", min=1, help="Prompt length [default: 512]."),
    new_tokens: int = typer.Option(
        64, "--new-tokens", min=1, help="Tokens decoded per sequence [default: 64]."
    ),
) -> None:
    """Tokens per second of a model on this machine: case-env's engine against transformers' generate, in one
    run (needs the model extra)."""
    from case_env.trl.commands import model_dir

    path = Path(model_dir(model))
    from case_env.bench.lm import bench_model as run
    from case_env.bench.lm import summary_lines

    for line in summary_lines(run(path, out, prompt_tokens=prompt_tokens, new_tokens=new_tokens)):
        typer.echo(line)
    typer.echo(f"wrote {out / 'model.json'}")


@bench_app.command("server")
def bench_server(
    env: str = typer.Option(None, "--env", help="The environment benchmarked (default: the default one)."),
    out: Path = typer.Option(
        None, "--out", help="Directory for bench.json (default: bench-out/server[-ENV])."
    ),
    rollouts: int = typer.Option(
        None, "--rollouts", "--clients", min=1, help="Concurrent virtual rollouts [default: 256]."
    ),
    duration: float = typer.Option(
        20.0, "--duration", min=1, help="Measured seconds per load (after warm-up)."
    ),
    warmup: float = typer.Option(5.0, "--warmup", min=0, help="Unmeasured seconds first (caches fill)."),
    workers: int = typer.Option(2, "--workers", min=1, help="Server worker processes."),
    think_ms: float = typer.Option(
        0.0, "--think-ms", min=0, help="Mean model time before each call (exponential); 0 = closed loop."
    ),
    group_size: int = typer.Option(
        1,
        "--group-size",
        min=1,
        help="Rollouts per GRPO group sharing case and calls (1: all independent).",
    ),
    runs: int = typer.Option(1, "--runs", min=1, help="Repeat the whole benchmark (figures of every run)."),
    data_root: Path = typer.Option(
        None,
        "--data-root",
        help="An environment served from a data root: the root (generated there once if it is missing, then "
        "reused; default data/bench).",
    ),
    baseline: str = typer.Option(
        None,
        "--baseline",
        help="Its baselines beside case-env, comma-separated (the default environment's: naive, the naive "
        "data engine; openenv, OpenEnv's app factory, the openenv extra; floor, a bare Starlette route).",
    ),
    cache_mb: int = typer.Option(
        None,
        "--cache-mb",
        min=0,
        help="Decoded-data cache budget per worker (a data root's) [default: the server's own].",
    ),
    doors: str = typer.Option(
        None,
        "--doors",
        help="An environment served from a data root: doors measured beside the tool API on one worker, "
        "comma-separated (openenv, mcp; their extras) [default: none].",
    ),
    stores: str = typer.Option(
        None,
        "--stores",
        help="An environment served from a data root: episode stores measured in turns, comma-separated "
        "(sqlite, redis: a redis-server started for the run) [default: sqlite].",
    ),
    model_latency_ms: str = typer.Option(
        None,
        "--model-latency-ms",
        help="A model-waiting environment: the stand-in model's latencies, comma-separated (default 0,300,2000).",
    ),
    model_failure_rate: float = typer.Option(
        None,
        "--model-failure-rate",
        min=0,
        max=1,
        help="Share of the stand-in's requests answered 500 (default 0).",
    ),
    rewards: int = typer.Option(None, "--rewards", min=1, help="Rows of the reward batch (default 1024)."),
    judge_latency_ms: float = typer.Option(
        None,
        "--judge-latency-ms",
        min=0,
        help="The stand-in judge's latency for the reward batch (default 500).",
    ),
) -> None:
    """Throughput, per-tool latency and errors of `case-env serve` under concurrent rollouts of one
    environment, against peers, floors and bounds measured in the same run."""
    found = registry.get(env) if env else registry.default()
    if not isinstance(found, Benchmarks):
        _fail(f"the {found.name} environment has no benchmarks", 2)
    try:
        latencies = [float(v) for v in model_latency_ms.split(",")] if model_latency_ms else None
    except ValueError:
        _fail(f"--model-latency-ms takes numbers separated by commas, not {model_latency_ms!r}", 2)
    default_out = Path(
        "bench-out/server" if found.name == registry.default().name else f"bench-out/server-{found.name}"
    )
    options = ServerBenchOptions(
        out=out or default_out,
        rollouts=rollouts or (MODEL_BENCH_ROLLOUTS if found.server_bench is not None else 256),
        duration=duration,
        warmup=warmup,
        workers=workers,
        think_ms=think_ms,
        group_size=group_size,
        runs=runs,
        data_root=data_root,
        baseline=baseline,
        cache_mb=cache_mb,
        doors=doors,
        stores=stores,
        model_latency_ms=latencies,
        model_failure_rate=model_failure_rate,
        rewards=rewards,
        judge_latency_ms=judge_latency_ms,
    )
    from case_env.bench.model_server import bench_server as run_bench

    try:
        run_bench(found, options, typer.echo)
    except ValueError as exc:
        _fail(str(exc), 2)


# a training step's episodes: 64 prompts x 16 samples (MedExAgent's GRPO step)
MODEL_BENCH_ROLLOUTS = 1024


@traj_app.command("to-sft")
def traj_to_sft(
    source: Path = typer.Argument(
        ..., help="A trajectory JSONL file, or a directory of them (e.g. an eval --out)."
    ),
    out: Path = typer.Option(..., "--out", help="Parquet file in verl's multi-turn SFT format."),
    all_: bool = typer.Option(False, "--all", help="Keep incorrect trajectories too."),
) -> None:
    """Write verl multi-turn SFT rows (messages, tools, images) from CASE-format trajectories."""
    from case_env.core.sft_data import TrajectoryFormatError, write_sft

    try:
        n = write_sft(source, out, correct_only=not all_)
    except (FileNotFoundError, TrajectoryFormatError, ValueError) as exc:
        _fail(str(exc), 2)
    typer.echo(f"wrote {n} rows to {out}")


def _bank_build(env, options) -> None:
    from case_env.core.bank import write

    built = env.build_bank(options)
    manifest = options.out / "bank.json"
    built.problems.echo(lambda line: typer.echo(line, err=True), "problem: ", where=str(manifest))
    write(built.result, options.out, {"env": env.name, **built.meta, "problems": built.problems.to_json()})
    Problems(built.result.skipped).echo(
        lambda line: typer.echo(line, err=True), "skipped ", where=str(manifest)
    )
    for line in built.table:
        typer.echo(line)
    typer.echo(f"wrote {options.out}")


options_command(
    bank_app,
    "build",
    "Build a bank of an environment's questions or cases: train/val/test parquet, case lists and bank.json.",
    Banks,
    lambda env: env.bank_options,
    _bank_build,
)


@bank_app.command("validate")
def bank_validate(
    files: list[Path] = typer.Argument(..., help="Parquet files in the CASE schema, or bank directories."),
) -> None:
    """Check parquet banks: columns, extra_info, ground truth, complete tool keys, each row by its environment."""
    from case_env.core.bank import bank_files
    from case_env.core.validate import validate

    try:
        paths = [split for given in files for split in (bank_files(given) if given.is_dir() else [given])]
    except FileNotFoundError as exc:
        _fail(str(exc), 2)
    failed = False
    for path in paths:
        result = validate(path)
        sources = ", ".join(f"{k} {v}" for k, v in sorted(result.by_source.items()))
        cases = len(result.by_case)
        typer.echo(f"{path}: {result.rows} rows, {cases} case{'' if cases == 1 else 's'} ({sources})")
        for problem in result.problems:
            typer.echo(f"problem: {path.name}: {problem}", err=True)
        failed |= not result.ok
    if failed:
        raise typer.Exit(1)


for _env in registry.environments().values():
    if isinstance(_env, Commands):
        _env.cli(GROUPS)


def main() -> None:
    try:
        app()
    except CommandError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("CASE_ENV_DEBUG") == "1":
            raise
        typer.echo(
            f"internal error: {type(exc).__name__}: {exc} (set CASE_ENV_DEBUG=1 for a traceback)", err=True
        )
        sys.exit(70)


if __name__ == "__main__":
    main()
