"""The `case-env` command line.

Expected failures (bad data, a directory we must not overwrite) print one clear line per problem and exit
non-zero; anything unexpected prints a one-line internal error instead of a traceback, unless
CASE_ENV_DEBUG=1 asks for the traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import typer

from case_env import __version__

app = typer.Typer(
    help="case-env: RL environment server for clinical agents that gather evidence with tools.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="Inspect and validate a patient data root.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Benchmarks (figures are ratios and timings measured in one run).", no_args_is_help=True
)
bank_app = typer.Typer(
    help="Build and validate question banks in the CASE parquet schema.", no_args_is_help=True
)
app.add_typer(data_app, name="data")
app.add_typer(bank_app, name="bank")
app.add_typer(bench_app, name="bench")
traj_app = typer.Typer(help="Work with recorded trajectories.", no_args_is_help=True)
app.add_typer(traj_app, name="traj")

KEY_ORGANS = ("liver", "spleen", "pancreas", "left_kidney", "right_kidney", "gallbladder", "stomach", "heart")


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def version() -> None:
    """Print the package version."""
    typer.echo(__version__)


@app.command()
def synth(
    out: Path = typer.Option(..., "--out", help="Output data root (created; must be empty or ours)."),
    patients: int = typer.Option(10, "--patients", min=1, max=9999, help="Number of patients."),
    profile: str = typer.Option(
        "ci", "--profile", help="ci (112x87x185, fast) or full (224x174x370, UK Biobank grid)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of all ground truth and noise."),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing synthetic dataset with other settings."
    ),
    jobs: int = typer.Option(0, "--jobs", help="Worker processes (0: one per CPU)."),
    env: str = typer.Option(
        "imaging",
        "--env",
        help="imaging (MRI patients), clinic (<out>/clinic/) or casereason (<out>/casereason/).",
    ),
    case_format: str = typer.Option(
        "csv", "--format", help="clinic: csv (MedExAgent table) or jsonl (eval)."
    ),
) -> None:
    """Generate deterministic synthetic longitudinal Dixon MRI patients, or synthetic clinic cases."""
    if env == "clinic":
        _synth_clinic(out, patients, seed, case_format)
        return
    if env == "casereason":
        from case_env.casereason.synth import write_cases

        path = out / "casereason" / "casereason_synthetic.jsonl"
        rows = write_cases(patients, seed, path)
        typer.echo(f"wrote {len(rows)} case-reasoning cases (seed {seed}) to {path}")
        return
    if env != "imaging":
        _fail(f"unknown environment {env!r}; choose imaging, clinic or casereason", 2)
    from case_env.synth.geometry import PROFILES
    from case_env.synth.writer import DatasetExistsError, generate_dataset

    if profile not in PROFILES:
        _fail(f"unknown profile {profile!r}; choose one of: {', '.join(PROFILES)}", 2)
    workers = jobs or os.cpu_count() or 1
    start = time.perf_counter()

    def progress(s) -> None:
        per_visit = ", ".join(f"{t:.1f}" for t in s.seconds_per_visit)
        typer.echo(f"  {s.public_id} ({s.subject}) {s.sex} {s.age}y {s.scenario:26s} {per_visit} s/visit")

    try:
        summaries, written = generate_dataset(out, patients, profile, seed, force, workers, progress)
    except DatasetExistsError as exc:
        _fail(str(exc))
        return
    if not written:
        typer.echo(
            f"{out}: {patients} {profile}-profile patients with seed {seed} already present; nothing to do"
        )
        return
    typer.echo(f"wrote {len(summaries)} patients to {out} in {time.perf_counter() - start:.1f} s")


def _synth_clinic(out: Path, cases: int, seed: int, case_format: str) -> None:
    from case_env.clinic.synth import make_cases, write_csv, write_jsonl

    if case_format not in ("csv", "jsonl"):
        _fail(f"unknown format {case_format!r}; choose csv or jsonl", 2)
    path = out / "clinic" / f"clinic_synthetic.{case_format}"
    made = make_cases(cases, seed)
    (write_csv if case_format == "csv" else write_jsonl)(made, path)
    conditions = len({c.diagnosis for c in made})
    typer.echo(f"wrote {len(made)} clinic cases ({conditions} conditions, seed {seed}) to {path}")


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve anywhere: treat it as exposed


@app.command()
def serve(
    data_root: Path = typer.Option(None, "--data-root", help="Patient data root (CASE_ENV_DATA_ROOT)."),
    host: str = typer.Option(None, "--host", help="Bind address (default 127.0.0.1; CASE_ENV_HOST)."),
    port: int = typer.Option(None, "--port", help="TCP port (default 8000; CASE_ENV_PORT)."),
    workers: int = typer.Option(
        None, "--workers", min=1, max=64, help="Worker processes (CASE_ENV_WORKERS)."
    ),
    audit_log: Path = typer.Option(None, "--audit-log", help="JSON-lines audit file (CASE_ENV_AUDIT_LOG)."),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level."),
    replay: Path = typer.Option(
        None, "--replay", help="Serve recorded tool outputs from trajectory files (no data root needed)."
    ),
    on_ray: bool = typer.Option(
        False, "--ray", help="Deploy as Ray Serve replicas (the cluster in RAY_ADDRESS, else a local Ray)."
    ),
    replicas: int = typer.Option(2, "--replicas", min=1, help="Ray Serve replicas (with --ray)."),
    clinic_cases: list[Path] | None = typer.Option(
        None,
        "--clinic-cases",
        help="Clinic case files or directories (CASE_ENV_CLINIC_CASES; default: "
        "<data root>/clinic/ when present).",
    ),
) -> None:
    """Run the tool server. With CASE_ENV_TOKEN set, /v1 routes and /metrics require `Authorization: Bearer`."""
    import tempfile

    import uvicorn

    from case_env.server.settings import ServerSettings
    from case_env.settings import DataSettings

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
    if clinic_cases:
        os.environ["CASE_ENV_CLINIC_CASES"] = os.pathsep.join(str(p.resolve()) for p in clinic_cases)
    settings = ServerSettings()
    data = DataSettings()
    if not _is_loopback(settings.host) and settings.token is None:
        _fail(
            f"refusing to listen on {settings.host} without a token: set CASE_ENV_TOKEN (or bind 127.0.0.1)",
            2,
        )
    if settings.replay_dir is not None:
        if not settings.replay_dir.exists():
            _fail(f"replay source {settings.replay_dir} does not exist", 2)
    elif not data.data_root.is_dir():
        _fail(f"data root {data.data_root} is not a directory (run `case-env synth` or set --data-root)", 2)
    with tempfile.TemporaryDirectory(prefix="case-env-") as run_dir:
        if on_ray:
            _serve_on_ray(settings, data, replicas, Path(run_dir))
            return
        if settings.workers > 1:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = run_dir
            if settings.episode_db is None:
                os.environ["CASE_ENV_EPISODE_DB"] = str(Path(run_dir) / "episodes.sqlite")
        uvicorn.run("case_env.server.app:create_app", factory=True, host=settings.host, port=settings.port,
                    workers=settings.workers, log_level=log_level)  # fmt: skip


def _serve_on_ray(settings, data, replicas: int, run_dir: Path) -> None:
    import signal
    import threading

    from case_env.server.ray_serve import deploy, settings_env

    if settings.episode_db is None:  # every replica must see every episode's binding
        os.environ["CASE_ENV_EPISODE_DB"] = str(run_dir / "episodes.sqlite")
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
    """Validate a data root and print each patient's organ volumes per visit (exit 1 on problems)."""
    from case_env.data.check import check_root

    report = check_root(root)
    clinic = _clinic_summary(root)
    if as_json:
        typer.echo(json.dumps({**report.to_json(), **({"clinic": clinic} if clinic else {})}, indent=2))
    else:
        _print_check(report)
        if clinic:
            sources = ", ".join(f"{k} {v}" for k, v in clinic["by_data_source"].items())
            typer.echo(f"clinic cases: {clinic['cases']} ({sources}), {clinic['conditions']} diagnoses")
            for problem in clinic["problems"]:
                typer.echo(f"warning: clinic: {problem}", err=True)
    if report.errors:
        raise typer.Exit(1)


def _clinic_summary(root: Path) -> dict | None:
    """The clinic cases under <root>/clinic/, which the server serves next to the imaging patients."""
    from collections import Counter

    from case_env.clinic.cases import load_cases

    if not (root / "clinic").is_dir():
        return None
    loaded = load_cases([root / "clinic"])
    return {"cases": len(loaded.cases), "conditions": len({c.diagnosis for c in loaded.cases}),
            "by_data_source": dict(sorted(Counter(c.data_source for c in loaded.cases).items())),
            "problems": loaded.problems}  # fmt: skip


def _print_check(report) -> None:
    header = f"{'patient':10s} {'visit':10s} {'date':10s} " + " ".join(f"{o[:12]:>12s}" for o in KEY_ORGANS)
    typer.echo(f"data root {report.root}: {len(report.patients)} patients (volumes in mL)")
    typer.echo(header + "  organs")
    for patient in report.patients:
        for v in patient.visits:
            cells = " ".join(f"{v.organs[o]:12.1f}" if o in v.organs else f"{'-':>12s}" for o in KEY_ORGANS)
            typer.echo(
                f"{patient.patient_id:10s} {v.visit:10s} {v.acq_date or '-':10s} {cells}  {len(v.organs)}"
            )
    for warning in report.warnings:
        typer.echo(f"warning: {warning}", err=True)
    for problem in report.errors:
        typer.echo(f"problem: {problem}", err=True)
    status = "ok" if not report.errors else f"{len(report.errors)} problem(s)"
    typer.echo(f"check: {status}")


@app.command("verl-config")
def verl_config(
    out: Path = typer.Option(
        Path("configs/verl/case_tools.yaml"), "--out", help="Where to write the tool YAML."
    ),
) -> None:
    """Write verl's tool config (one CaseTool entry per tool, schemas from the registry)."""
    from case_env.verl.config import write

    typer.echo(f"wrote {write(out)}")


@app.command()
def rollouts(
    bank: Path = typer.Option(Path("data/bank"), "--bank", help="Bank directory (uses test.parquet)."),
    split: str = typer.Option("test", "--split", help="Which split's questions to roll out."),
    server_url: str = typer.Option(
        "http://127.0.0.1:8765", "--server-url", help="case-env server (started if absent)."
    ),
    data_root: Path = typer.Option(
        Path("data/synthetic"), "--data-root", help="Data root for a started server."
    ),
    per_source: int = typer.Option(8, "--per-source", min=1, help="Questions per data source."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Trajectories in flight."),
) -> None:
    """Scripted-policy rollouts through verl's ToolAgentLoop, scored by verl's reward manager (needs verl)."""
    from case_env.server.control import ensure_server, stop
    from case_env.verl.rollouts import run_rollouts

    parquet = bank / f"{split}.parquet"
    if not parquet.is_file():
        _fail(f"{parquet} is missing (run `case-env bank build`)", 2)
    server = ensure_server(server_url, data_root)
    try:
        summary = run_rollouts(parquet, server_url, per_source, concurrency)
    finally:
        stop(server)
    typer.echo(f"{'data source':18s} {'n':>4s} {'mean reward':>12s} {'accuracy':>9s} {'format ok':>10s} "
               f"{'tool calls':>11s} {'infra errors':>13s}")  # fmt: skip
    for source, s in summary.items():
        if s.n:
            typer.echo(f"{source:18s} {s.n:4d} {s.reward / s.n:12.2f} {s.correct / s.n:9.2f} {s.format_ok / s.n:10.2f} "
                       f"{s.tool_calls / s.n:11.1f} {s.infra_errors:13d}")  # fmt: skip


@app.command("eval")
def eval_(
    bank: Path = typer.Option(
        ..., "--bank", help="A bank parquet file, or a bank directory (all its splits)."
    ),
    server_url: str = typer.Option(..., "--server", help="Base URL of a running case-env server."),
    agent: str = typer.Option(..., "--agent", help="openai, scripted, vision, no-tool or random."),
    out: Path = typer.Option(
        ..., "--out", help="Directory for trajectories.jsonl, images/ and results.json."
    ),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="Questions in flight."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N questions."),
    resume: bool = typer.Option(False, "--resume", help="Continue a run in --out, skipping finished items."),
    token: str | None = typer.Option(
        None, "--token", envvar="CASE_ENV_TOKEN", help="Bearer token of the server."
    ),
    repeats: int = typer.Option(
        1, "--repeats", min=1, help="Rollouts per question; accuracy is the mean over all of them."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random and no-tool agents' draws."),
    model_url: str | None = typer.Option(
        None,
        "--model-url",
        help="openai agent: base URL of an OpenAI-compatible server, e.g. http://host:8000/v1.",
    ),
    model_name: str | None = typer.Option(None, "--model", help="openai agent: model name to request."),
    api_key: str = typer.Option("EMPTY", "--api-key", envvar="OPENAI_API_KEY", help="openai agent: API key."),
    max_turns: int = typer.Option(16, "--max-turns", min=1, help="openai agent: model turns per question."),
    call_timeout: float = typer.Option(
        120.0, "--call-timeout", min=1.0, help="openai agent: seconds per chat completion call."
    ),
    temperature: float = typer.Option(
        0.0, "--temperature", min=0.0, help="openai agent: sampling temperature."
    ),
) -> None:
    """Evaluate a policy over a bank against a live server; prints accuracy per data source."""
    import httpx

    from case_env.casereason.evaluate import AGENTS as REASON_AGENTS
    from case_env.clinic.evaluate import AGENTS as CLINIC_AGENTS
    from case_env.clinic.evaluate import bank_environment
    from case_env.eval.openai_agent import ModelSettings
    from case_env.eval.runner import AGENTS, run_eval
    from case_env.eval.trajectory import TrajectoryFormatError

    if agent not in (*AGENTS, *CLINIC_AGENTS, *REASON_AGENTS):
        _fail(f"unknown agent {agent!r}; choose one of {', '.join(AGENTS)} (imaging banks), "
              f"{', '.join(CLINIC_AGENTS)} (clinic banks) or {', '.join(REASON_AGENTS)} (casereason banks)", 2)  # fmt: skip
    model = None
    if agent == "openai":
        if not model_url or not model_name:
            _fail("the openai agent needs --model-url and --model", 2)
        model = ModelSettings(base_url=model_url, model=model_name, api_key=api_key, max_turns=max_turns,
                              timeout_s=call_timeout, temperature=temperature)  # fmt: skip
    try:
        kind = bank_environment(bank)
    except FileNotFoundError as exc:
        _fail(str(exc), 2)
        return
    valid = {"clinic": CLINIC_AGENTS, "casereason": REASON_AGENTS}.get(kind, AGENTS)
    if agent not in valid:
        _fail(f"agent {agent!r} does not play a {kind} bank; choose one of {', '.join(valid)}", 2)
    if kind == "casereason":
        _eval_casereason(bank, server_url, agent, out, concurrency, limit, token, model)
        return
    clinic = kind == "clinic"
    if clinic:
        _eval_clinic(bank, server_url, agent, out, concurrency, limit, resume, token, model, max_turns)
        return
    try:
        results = run_eval(bank, server_url, agent, out, concurrency, limit, resume, token, model=model,
                           repeats=repeats, seed=seed)  # fmt: skip
    except (FileNotFoundError, FileExistsError, TrajectoryFormatError) as exc:
        _fail(str(exc), 2)
    except httpx.HTTPError as exc:
        _fail(f"server {server_url} failed: {exc}", 1)
    typer.echo(
        f"{'data source':18s} {'n':>4s} {'accuracy':>9s} {'chance':>7s} {'tool calls':>11s} {'format err':>11s}"
    )
    for source, s in results["by_data_source"].items():
        typer.echo(f"{source:18s} {s['n']:4d} {s['accuracy']:9.3f} {s['chance']:7.3f} "
                   f"{s['mean_tool_calls']:11.1f} {s['format_error_rate']:11.3f}")  # fmt: skip
    overall = results["overall"]
    typer.echo(f"{'overall':18s} {overall['n']:4d} {overall['accuracy']:9.3f}"
               + (f"   ({overall['questions']} questions x {overall['repeats']} rollouts)" if overall["repeats"] > 1 else ""))  # fmt: skip
    typer.echo(f"wrote {out / 'results.json'}, {out / 'report.html'} and {out / 'trajectories.jsonl'}")


def _run_eval(run, server_url: str) -> dict:
    """A text environment's eval, its expected failures as one line and an exit code."""
    import httpx

    try:
        return run()
    except (FileNotFoundError, FileExistsError, LookupError) as exc:
        _fail(str(exc), 2)
    except httpx.HTTPError as exc:
        _fail(f"server {server_url} failed: {exc}", 1)
    raise AssertionError("unreachable")  # _fail raises


def _eval_casereason(bank: Path, server_url: str, agent: str, out: Path, concurrency: int, limit: int | None,
                     token: str | None, model) -> None:  # fmt: skip
    from case_env.casereason.evaluate import run_casereason_eval

    results = _run_eval(lambda: run_casereason_eval(bank, server_url, agent, out, concurrency, limit, token, model),
                        server_url)  # fmt: skip
    typer.echo(
        f"{'data source':14s} {'n':>4s} {'mode':12s} {'acc@1':>6s} {'acc@5':>6s} {'acc@10':>7s} {'recall':>7s}"
    )
    for name, g in {**results["by_data_source"], "overall": results["overall"]}.items():
        for mode in ("independent", "sequential"):
            a = g[mode]
            typer.echo(f"{name:14s} {g['n']:4d} {mode:12s} {a.get('acc@1', 0):6.3f} {a.get('acc@5', 0):6.3f} "
                       f"{a.get('acc@10', 0):7.3f} {g['recall']:7.3f}")  # fmt: skip
    typer.echo(f"wrote {out / 'results.json'} and {out / 'trajectories.jsonl'}")


def _eval_clinic(bank: Path, server_url: str, agent: str, out: Path, concurrency: int, limit: int | None,
                 resume: bool, token: str | None, model, max_turns: int) -> None:  # fmt: skip
    from case_env.clinic.evaluate import run_clinic_eval

    results = _run_eval(lambda: run_clinic_eval(bank, server_url, agent, out, concurrency, limit, resume, token,
                                                model, max_turns=max(max_turns, 20)), server_url)  # fmt: skip
    typer.echo(
        f"{'group':22s} {'n':>4s} {'strict':>7s} {'lenient':>8s} {'cost':>6s} {'exams':>6s} {'turns':>6s}"
    )
    groups = {**results["by_data_source"], "overall": results["overall"], **results["by_noise"]}
    for name, g in groups.items():
        typer.echo(f"{name:22s} {g['n']:4d} {g['accuracy_strict']:7.3f} {g['accuracy_lenient']:8.3f} "
                   f"{g['cost']:6.2f} {g['exams']:6.2f} {g['turns']:6.2f}")  # fmt: skip
    typer.echo(f"wrote {out / 'results.json'}, {out / 'report.html'} and {out / 'trajectories.jsonl'}")


@traj_app.command("to-sft")
def traj_to_sft(
    source: Path = typer.Argument(
        ..., help="A trajectory JSONL file, or a directory of them (e.g. an eval --out)."
    ),
    out: Path = typer.Option(..., "--out", help="Parquet file in verl's multi-turn SFT format."),
    all_: bool = typer.Option(False, "--all", help="Keep incorrect trajectories too."),
) -> None:
    """Write verl multi-turn SFT rows (messages, tools, images) from CASE-format trajectories."""
    from case_env.eval.sft import TrajectoryFormatError, write_sft

    try:
        n = write_sft(source, out, correct_only=not all_)
    except (FileNotFoundError, TrajectoryFormatError, ValueError) as exc:
        _fail(str(exc), 2)
    typer.echo(f"wrote {n} rows to {out}")


@bank_app.command("build")
def bank_build(
    data_root: Path | None = typer.Option(
        None,
        "--data-root",
        help="Synthetic data root (imaging: needs phantom manifests; clinic: its clinic/).",
    ),
    out: Path = typer.Option(
        ..., "--out", help="Output directory for train/val/test parquet and patient lists."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of question choice, distractors, letters and splits."),
    split: str = typer.Option("0.8,0.1,0.1", "--split", help="train,val,test fractions of the patients."),
    env: str = typer.Option(
        "imaging", "--env", help="imaging (multiple choice), clinic (diagnosis) or casereason (case reports)."
    ),
    mode: str = typer.Option(
        "independent",
        "--mode",
        help="casereason: independent (single turn) or sequential (submit_diagnosis).",
    ),
    attempts: int = typer.Option(
        10, "--attempts", min=1, max=64, help="casereason: attempts k (sequential)."
    ),
    recall_weight: float = typer.Option(
        0.0, "--recall-weight", min=0, help="casereason: reward weight of recall."
    ),
    cases: list[Path] | None = typer.Option(
        None, "--cases", help="clinic: case CSV/JSONL files or directories (default: <data-root>/clinic)."
    ),
    patient_noise: float = typer.Option(0.0, "--patient-noise", min=0, max=1, help="clinic: noisy patients."),
    exam_noise: float = typer.Option(0.0, "--exam-noise", min=0, max=1, help="clinic: noisy exam results."),
    noise_seed: int = typer.Option(42, "--noise-seed", help="clinic: seed of the noise draws."),
) -> None:
    """Build a multiple-choice question bank from synthetic ground truth, or a clinic diagnosis bank."""
    from case_env.bank.build import build, write
    from case_env.data.store import PatientStore

    try:
        fractions = tuple(float(x) for x in split.split(","))
    except ValueError:
        fractions = ()
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        _fail(f"--split must be three non-negative fractions summing to 1, not {split!r}", 2)
    if env == "casereason":
        _bank_casereason(data_root, cases or [], out, seed, fractions, mode, attempts, recall_weight)  # type: ignore[arg-type]
        return
    if env == "clinic":
        _bank_clinic(data_root, cases or [], out, seed, fractions, patient_noise, exam_noise, noise_seed)  # type: ignore[arg-type]
        return
    if env != "imaging":
        _fail(f"unknown environment {env!r}; choose imaging or clinic", 2)
    if data_root is None:
        _fail("--data-root is required for an imaging bank", 2)
        return
    store = PatientStore(data_root)
    if store.index.errors or not store.patient_ids():
        for problem in store.index.errors[:10] or ["no patients"]:
            typer.echo(f"problem: {problem}", err=True)
        _fail(f"{data_root} is not a usable data root (see `case-env data check`)")
    result = build(store, seed, fractions)  # type: ignore[arg-type]
    write(result, out, {"seed": seed, "split": fractions, "data_root": str(store.root)})
    for line in result.skipped:
        typer.echo(f"skipped {line}", err=True)
    typer.echo(
        f"{'split':6s} {'patients':>8s} " + " ".join(f"{s:>17s}" for s in _SOURCES) + f" {'total':>6s}"
    )
    for name, counts in result.counts().items():
        cells = " ".join(f"{counts.get(s, 0):17d}" for s in _SOURCES)
        typer.echo(f"{name:6s} {len(result.patients[name]):8d} {cells} {sum(counts.values()):6d}")
    typer.echo(f"wrote {out}")


_SOURCES = ("vista3d_opsd", "medpanel_v2_opsd", "medboard_opsd")


def _text_cases(load_cases, data_root: Path | None, cases: list[Path], env: str):
    """(paths, loaded) of a text environment's bank: --cases, else <data root>/<env>/; problems printed."""
    paths = cases or ([data_root / env] if data_root is not None else [])
    if not paths:
        _fail(f"a {env} bank needs --cases, or --data-root holding {env}/", 2)
    try:
        loaded = load_cases(paths)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        _fail(str(exc), 2)
    for problem in loaded.problems[:20]:
        typer.echo(f"problem: {problem}", err=True)
    if not loaded.cases:
        _fail(f"no usable {env} cases in {', '.join(map(str, paths))}")
    return paths, loaded


def _bank_casereason(data_root: Path | None, cases: list[Path], out: Path, seed: int,
                     fractions: tuple[float, float, float], mode: str, attempts: int, recall_weight: float) -> None:  # fmt: skip
    from case_env.bank.build import write
    from case_env.casereason.bank import MODES, build
    from case_env.casereason.cases import load_cases

    if mode not in MODES:
        _fail(f"unknown mode {mode!r}; choose {' or '.join(MODES)}", 2)
    paths, loaded = _text_cases(load_cases, data_root, cases, "casereason")
    result = build(loaded.cases, seed, fractions, mode, attempts, recall_weight)
    write(result, out, {"env": "casereason", "seed": seed, "split": fractions, "mode": mode, "attempts": attempts,
                        "cases": [str(p) for p in paths], "problems": loaded.problems})  # fmt: skip
    for name, rows in result.rows.items():
        typer.echo(f"{name:6s} {len(rows):6d} cases ({mode}, k={attempts if mode == 'sequential' else 1})")
    typer.echo(f"wrote {out}")


def _bank_clinic(data_root: Path | None, cases: list[Path], out: Path, seed: int,
                 fractions: tuple[float, float, float], patient_noise: float, exam_noise: float,
                 noise_seed: int) -> None:  # fmt: skip
    from case_env.bank.build import write
    from case_env.clinic.bank import build
    from case_env.clinic.cases import load_cases
    from case_env.clinic.noise import NoiseConfig

    paths, loaded = _text_cases(load_cases, data_root, cases, "clinic")
    noise = NoiseConfig(seed=noise_seed, patient_rate=patient_noise, exam_rate=exam_noise)
    result = build(loaded.cases, seed, fractions, noise)
    write(result, out, {"env": "clinic", "seed": seed, "split": fractions, "cases": [str(p) for p in paths],
                        "noise": noise.model_dump(), "problems": loaded.problems})  # fmt: skip
    sources = sorted({s for c in result.counts().values() for s in c})
    typer.echo(f"{'split':6s} {'cases':>6s} " + " ".join(f"{s:>17s}" for s in sources) + f" {'noisy':>6s}")
    for name, rows in result.rows.items():
        counts = result.counts()[name]
        noisy = sum(bool(json.loads(r["extra_info"])["noise"]["labels"]) for r in rows)
        cells = " ".join(f"{counts.get(s, 0):17d}" for s in sources)
        typer.echo(f"{name:6s} {len(result.patients[name]):6d} {cells} {noisy:6d}")
    typer.echo(f"wrote {out}")


@bank_app.command("validate")
def bank_validate(files: list[Path] = typer.Argument(..., help="Parquet files in the CASE schema.")) -> None:
    """Check parquet banks: columns, extra_info JSON, ground truth among options, complete tool keys."""
    from case_env.bank.validate import validate

    failed = False
    for path in files:
        result = validate(path)
        sources = ", ".join(f"{k} {v}" for k, v in sorted(result.by_source.items()))
        typer.echo(f"{path}: {result.rows} rows, {len(result.by_patient)} patients ({sources})")
        for problem in result.problems:
            typer.echo(f"problem: {path.name}: {problem}", err=True)
        failed |= not result.ok
    if failed:
        raise typer.Exit(1)


@bench_app.command("data")
def bench_data(
    out: Path = typer.Option(
        Path("bench-out/data"), "--out", help="Directory for bench.json and scratch data."
    ),
    patients: int = typer.Option(2, "--patients", min=1, help="Patients generated per profile."),
    profiles: str = typer.Option("ci,full", "--profiles", help="Comma-separated profiles to measure."),
    cache_mb: int = typer.Option(512, "--cache-mb", min=1, help="Cache budget for the memory measurement."),
) -> None:
    """Generation, first-touch load, slice fetch and memory figures of the data layer."""
    from case_env.bench.data import run_data_bench

    result = run_data_bench(out, patients, [p.strip() for p in profiles.split(",") if p.strip()], cache_mb)
    typer.echo(json.dumps(result, indent=2))


@bench_app.command("server")
def bench_server(
    data_root: Path = typer.Option(
        Path("data/synthetic"), "--data-root", help="Data root (10 ci-profile patients generated if missing)."
    ),
    out: Path = typer.Option(
        Path("bench-out/server"), "--out", help="Directory for bench.json and bench.png."
    ),
    rollouts: int = typer.Option(256, "--rollouts", "--clients", min=1, help="Concurrent virtual rollouts."),
    duration: float = typer.Option(
        20.0, "--duration", min=1, help="Measured seconds per engine (after warm-up)."
    ),
    warmup: float = typer.Option(5.0, "--warmup", min=0, help="Unmeasured seconds first (caches fill)."),
    workers: int = typer.Option(2, "--workers", min=1, help="Server worker processes (both engines)."),
    baseline: str | None = typer.Option(
        None, "--baseline", help="'naive': also run the naive reference engine and report ratios."
    ),
    cache_mb: int | None = typer.Option(
        None, "--cache-mb", min=0, help="Decoded-volume cache budget per worker."
    ),
    think_ms: float = typer.Option(
        0.0, "--think-ms", min=0, help="Mean model time before each call (exponential); 0 = closed loop."
    ),
    group_size: int = typer.Option(
        1,
        "--group-size",
        min=1,
        help="Rollouts per GRPO group sharing patient and calls (1: all independent).",
    ),
) -> None:
    """Throughput, per-tool latency, errors, server CPU and peak RSS of `case-env serve` under concurrent rollouts."""
    from case_env.bench.server import run_server_bench
    from case_env.synth.writer import generate_dataset

    if baseline not in (None, "naive"):
        _fail(f"unknown baseline {baseline!r}; the only one is 'naive'", 2)
    if not data_root.is_dir():
        typer.echo(f"{data_root} missing: generating 10 ci-profile patients")
        generate_dataset(data_root, 10, "ci", 0, jobs=os.cpu_count() or 1)
    result = run_server_bench(
        data_root, out, rollouts, duration, workers, warmup, baseline, cache_mb, think_ms, group_size
    )
    for engine, run in result["runs"].items():
        typer.echo(f"\n{engine}: {run['calls_per_s']} calls/s, {rollouts} rollouts, {workers} worker(s), "
                   f"server CPU {run['server_cpu_cores']} cores, peak RSS {run['server_peak_rss_mb']} MB, "
                   f"errors {run['errors'] or 'none'}")  # fmt: skip
        typer.echo(f"  {'tool':22s} {'n':>7s} {'p50 ms':>8s} {'p95 ms':>8s} {'p99 ms':>8s}")
        for tool, f in {**run["latency_ms"], "all": run["latency_ms_all"]}.items():
            typer.echo(f"  {tool:22s} {f['n']:7d} {f['p50']:8.1f} {f['p95']:8.1f} {f['p99']:8.1f}")
    if "ratio_vs_naive" in result:
        r = result["ratio_vs_naive"]
        typer.echo(f"\nvs naive: {r['throughput']}x throughput, {r['p99']}x lower p99")
    met = result["met"]
    typer.echo("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items()))
    typer.echo(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")


def main() -> None:
    from case_env.memory import release_freed_memory_promptly

    release_freed_memory_promptly()
    try:
        app()
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
