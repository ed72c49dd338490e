"""`case-env synth` as a user runs it: skips identical work, never overwrites what is not ours."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "case_env.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_synth_writes_skips_and_refuses(tmp_path):
    out = tmp_path / "data"
    first = run(
        "synth", "--out", str(out), "--patients", "1", "--profile", "ci", "--seed", "3", "--jobs", "1"
    )
    assert first.returncode == 0, first.stderr
    assert "case0001" in first.stdout and "wrote 1 patients" in first.stdout
    again = run("synth", "--out", str(out), "--patients", "1", "--profile", "ci", "--seed", "3")
    assert again.returncode == 0 and "already present; nothing to do" in again.stdout
    other = run("synth", "--out", str(out), "--patients", "1", "--profile", "ci", "--seed", "4")
    assert other.returncode == 1 and "pass --force" in other.stderr and "Traceback" not in other.stderr
    forced = run("synth", "--out", str(out), "--patients", "1", "--profile", "ci", "--seed", "4", "--force")
    assert forced.returncode == 0
    description = json.loads((out / "dataset_description.json").read_text())
    assert description["GeneratedBy"][0]["Seed"] == 4


def test_synth_never_touches_foreign_directories(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    result = run("synth", "--out", str(out), "--patients", "1", "--force")
    assert result.returncode == 1 and "refusing to touch it" in result.stderr
    assert (out / "precious.txt").read_text() == "keep me"


def test_bad_arguments_get_usage_errors(tmp_path):
    result = run("synth", "--out", str(tmp_path / "x"), "--profile", "huge")
    assert result.returncode == 2 and "unknown profile 'huge'" in result.stderr
    result = run("synth", "--out", str(tmp_path / "x"), "--patients", "0")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_bench_data_reports_every_figure(tmp_path):
    result = run("bench", "data", "--out", str(tmp_path / "bench"), "--patients", "1", "--profiles", "ci")
    assert result.returncode == 0, result.stderr
    figures = json.loads((tmp_path / "bench" / "bench.json").read_text())["profiles"]["ci"]
    assert figures["generation_s_per_visit"]["median"] > 0
    assert figures["first_touch_s_per_visit"]["median"] > 0
    touch = figures["first_touch_s_per_patient"]
    assert set(touch) == {"sequential", "preload", "mapped"} and min(touch.values()) > 0
    assert (
        touch["mapped"] < touch["sequential"]
    )  # mapping decoded files beats decoding gzip, whatever the noise
    assert set(figures["slice_from_cache_us"]) == {"sagittal", "coronal", "axial"}
    memory = figures["memory"]
    assert memory["cache_bytes_mb_at_end"] <= memory["cache_budget_mb"]
    assert memory["cache_evictions"] > 0


def test_each_bench_run_reads_its_data_into_the_page_cache_first(tmp_path):
    from case_env.bench.measure import page_in

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "one.npy").write_bytes(b"x" * 3_000_000)  # more than one read's buffer
    (tmp_path / "a" / "b" / "two.json").write_bytes(b"{}")
    assert page_in([tmp_path / "a", tmp_path / "missing"]) == 3_000_002


def on_a_terminal(*args: str) -> tuple[int, str, str]:
    """(exit code, stdout, what reached the terminal) of the CLI with its stderr on a pseudo-terminal."""
    import os
    import pty
    import threading

    main, child = pty.openpty()
    command = [sys.executable, "-m", "case_env.cli", *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=child, text=True) as process:
        os.close(child)
        seen = bytearray()

        def drain() -> None:
            with contextlib.suppress(OSError):
                while chunk := os.read(main, 4096):
                    seen.extend(chunk)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        stdout, _ = process.communicate(timeout=900)
        reader.join(timeout=10)
    os.close(main)
    return process.returncode, stdout, seen.decode(errors="replace")


def test_bench_server_measures_case_env_against_every_baseline(dataset, tmp_path):
    code, stdout, terminal = on_a_terminal(
        *("bench", "server", "--data-root", str(dataset), "--out", str(tmp_path / "bench")),
        *("--rollouts", "4", "--duration", "1", "--warmup", "0.5", "--workers", "1"),
        *("--baseline", "naive,openenv,floor", "--doors", "openenv,mcp", "--stores", "sqlite,redis"),
    )
    assert code == 0, terminal[-3000:]
    # on a terminal it says what runs now, on one rewritten line; its results alone go to stdout
    assert "\r\x1b[Kcase-env (episode mix, load): 1.5 s" in terminal and "mcp-door (episode mix, " in terminal
    assert "\r" not in stdout and "(episode mix, load)" not in stdout
    # ratios phrased one way, each target with its threshold
    assert re.search(r"^cheap mix: [\d.]+x openenv's calls/s, [\d.]+x its p99 latency, ", stdout, re.M)
    assert re.search(r"^targets: \d+ of 12 met$", stdout, re.M)
    assert re.search(
        r"^cheap/no-cache with Redis: [\d.]+x SQLite's calls/s, [\d.]+x its CPU per call", stdout, re.M
    )
    assert re.search(r"^  (met   |MISSED)  render p99 < 250 ms$", stdout, re.M)
    assert re.search(r"^  (met   |MISSED)  mcp-door <= 1.5x the tool API's CPU per call$", stdout, re.M)
    figures = json.loads((tmp_path / "bench" / "bench.json").read_text())
    engines = ("case-env", "naive", "openenv", "floor")
    assert figures["baselines"] == ["naive", "openenv", "floor"]
    assert set(figures["runs"]) == {
        *(
            "case-env",
            "case-env/no-cache",
            "case-env/cheap",
            "case-env/cheap/no-cache",
            "case-env/render/no-cache",
            "case-env/no-cache/redis",
            "case-env/cheap/no-cache/redis",
        ),
        *(f"{e}{mix}" for e in engines[1:] for mix in ("", "/cheap")),
        "openenv/render",
        *("case-env/doors", "openenv-door", "mcp-door", "openenv/doors"),
    }
    tools = {
        "list_visits",
        "get_clinical_context",
        "get_organ_volume",
        "compare_organ_volume",
        "render_slice",
        "render_comparison",
        "read_report",
    }
    for name, run_figures in figures["runs"].items():
        assert run_figures["errors"] == {} and run_figures["calls"] > 0, name
        if run_figures["mix"] in ("cheap", "render"):
            assert set(run_figures["latency_ms"]) == {
                "list_visits" if run_figures["mix"] == "cheap" else "render_slice"
            }
        elif run_figures["engine"] != "naive":  # the naive engine may not finish an episode in 2 s
            assert set(run_figures["latency_ms"]) == tools, name
        for tool in run_figures["latency_ms"].values():
            assert 0 < tool["p50"] <= tool["p95"] <= tool["p99"]
        assert run_figures["server_cpu_cores"] > 0 and run_figures["server_cpu_ms_per_call"] > 0
        assert run_figures["load_cpu_ms_per_call"] > 0  # what the load generator took from the shared cores
        if run_figures["engine"] != "naive":
            assert set(run_figures["unloaded_ms"]) == set(run_figures["latency_ms"]), name
    runs = figures["runs"]
    # the response cache answers repeated calls when on, none when off; list_visits (inline) never asks it
    assert 0 < runs["case-env"]["response_cache_hit_rate"] < 1
    assert runs["case-env/no-cache"]["response_cache_hit_rate"] == 0.0
    assert runs["case-env/cheap"]["response_cache_hit_rate"] == 0.0
    for baseline in ("naive", "openenv", "floor"):
        ratios = figures[f"ratio_vs_{baseline}"]
        renders = {"render/no-cache"} if baseline == "openenv" else set()
        assert set(ratios) == {"episode", "no-cache", "cheap", "cheap/no-cache", *renders}
        cheap = ratios["cheap"]
        assert cheap["cpu_per_call"] == round(
            runs["case-env/cheap"]["server_cpu_ms_per_call"]
            / runs[f"{baseline}/cheap"]["server_cpu_ms_per_call"],
            2,
        )
        assert cheap["throughput"] == round(
            runs["case-env/cheap"]["calls_per_s"] / runs[f"{baseline}/cheap"]["calls_per_s"], 2
        )
    # the cheap and render mixes ran in turns: four rounds per engine, their calls summed, every engine in
    # every round; the episode mix one engine after the other
    paired = ("case-env/cheap", "case-env/cheap/no-cache", "naive/cheap", "openenv/cheap", "floor/cheap")
    stores = ("case-env/no-cache", "case-env/no-cache/redis", "case-env/cheap/no-cache/redis")
    for name in (*paired, *stores, "case-env/render/no-cache", "openenv/render"):
        rounds = runs[name]["rounds"]
        assert len(rounds) == 4 and all(r["calls_per_s"] > 0 for r in rounds), name
        latency = runs[name]["latency_ms"]  # every call's latency, of the mix's tools
        assert sum(tool["n"] for tool in latency.values()) == runs[name]["calls"], name
        if runs[name]["mix"] != "episode":
            assert set(latency) == {"render_slice" if runs[name]["mix"] == "render" else "list_visits"}
    assert "rounds" not in runs["case-env"]
    # each store against SQLite in the same mix, the Redis runs' CPU their servers' and redis-server's
    assert set(figures["stores"]) == {"no-cache", "cheap/no-cache"}
    for mix, ratio in figures["stores"].items():
        redis, sqlite = runs[f"case-env/{mix}/redis"], runs[f"case-env/{mix}"]
        assert redis["store"] == "redis" and sqlite["store"] == "sqlite"
        assert ratio["cpu_per_call"] == round(
            redis["server_cpu_ms_per_call"] / sqlite["server_cpu_ms_per_call"], 2
        )
    assert figures["ratio_vs_naive"]["episode"]["unloaded_episode"] > 1  # decoding on every call is slower
    assert figures["ratio_vs_floor"]["episode"]["cpu_per_call"] > 1  # the floor does no work at all
    assert set(figures["met"]) == {
        *("calls_per_s", "render_p99_ms", "text_p99_ms", "zero_errors", "ratio_throughput"),
        *("cheap_cpu_vs_floor", "calls_per_s_no_cache", "render_cpu_ms", "throughput_vs_openenv"),
        *("openenv-door_cpu_vs_api", "mcp-door_cpu_vs_api", "store_cpu_vs_sqlite"),
    }
    # each door beside the tool API on one worker: its calls/s and server CPU per call as ratios to the API's
    api = runs["case-env/doors"]
    for door in ("openenv-door", "mcp-door"):
        through, ratio = runs[door], figures["doors"][door]
        assert set(through["latency_ms"]) == set(api["latency_ms"]) == tools
        assert ratio["cpu_per_call"] == round(
            through["server_cpu_ms_per_call"] / api["server_cpu_ms_per_call"], 2
        )
        assert ratio["throughput"] == round(through["calls_per_s"] / api["calls_per_s"], 2)
        assert re.search(rf"^{door} \(one worker\): [\d.]+x the tool API's calls/s", stdout, re.M)
    # bench.png: a column per mix (episode, cheap, render), calls/s above p99, on linear axes from zero
    from case_env.envs.imaging.bench.server import _panel

    panels = {"episode mix", "cheap mix", "render mix", "doors, one worker"}
    assert {_panel(name, r) for name, r in runs.items()} == panels
    width, height = Image.open(tmp_path / "bench" / "bench.png").size
    assert (width, height) == (round(4.4 * 4 * 90), round(6.2 * 90))
    unknown = run("bench", "server", "--data-root", str(dataset), "--baseline", "naive,ray")
    assert unknown.returncode == 2 and "unknown baseline 'ray'" in unknown.stderr


def test_bench_server_measures_a_model_waiting_environment_against_its_bounds(tmp_path):
    """`bench server --env clinic` at a small scale: the stand-in patient at two latencies, the burst and the
    reward batch with their bounds; options of another kind of benchmark refused by name."""
    result = run(
        *("bench", "server", "--env", "clinic", "--out", str(tmp_path / "bench")),
        *("--rollouts", "16", "--duration", "3", "--warmup", "0.5", "--workers", "1"),
        *("--model-latency-ms", "0,200", "--rewards", "48", "--judge-latency-ms", "200"),
    )
    assert result.returncode == 0, result.stderr
    assert "burst: 1024 episodes" in result.stdout and "rewards: 48 scored" in result.stdout
    figures = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert figures["env"] == "clinic" and len(figures["runs"]) == 1
    run_figures = figures["runs"][0]
    assert set(run_figures["calls"]) == {"0", "200"}
    for latency, calls in run_figures["calls"].items():
        assert calls["errors"] == {} and calls["fallbacks"] == 0, latency
        assert calls["latency_ms"]["ask_patient"]["n"] > 0 and calls["model"]["requests"] > 0
    slow = run_figures["calls"]["200"]["latency_ms"]["ask_patient"]
    assert slow["p50"] >= 200  # every answer waited on the stand-in
    burst = run_figures["burst"]
    assert (
        burst["outcomes"] == {"ok": 1024}
        and burst["model_peak_in_flight"] == burst["in_flight_allowed"] == 256
    )
    assert burst["bound_s"] == 4 and burst["seconds"] >= 4  # four replies of 1 s, 256 at a time
    rewards = run_figures["rewards"]
    assert rewards["errors"] == 0 and rewards["key_sets"] == 1 and rewards["judged"] == 48
    assert rewards["judge_requests"] == 48 and rewards["sequential_bound_s"] == 9.6
    refused = run("bench", "server", "--env", "clinic", "--baseline", "naive", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "the clinic server benchmark takes no --baseline" in refused.stderr
    refused = run("bench", "server", "--model-latency-ms", "300", "--out", str(tmp_path / "y"))
    assert (
        refused.returncode == 2
        and "the imaging server benchmark takes no --model-latency-ms" in refused.stderr
    )


def test_eval_traj_and_replay_name_bad_input(tmp_path):
    bank = tmp_path / "bank.parquet"
    result = run(
        "eval",
        "--bank",
        str(bank),
        "--server",
        "http://127.0.0.1:9",
        "--agent",
        "oracle",
        "--out",
        str(tmp_path / "out"),
    )
    assert result.returncode == 2 and "unknown agent 'oracle'" in result.stderr
    result = run(
        "eval",
        "--bank",
        str(bank),
        "--server",
        "http://127.0.0.1:9",
        "--agent",
        "random",
        "--out",
        str(tmp_path / "out"),
    )
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr
    result = run(
        "eval",
        "--bank",
        str(bank),
        "--server",
        "http://127.0.0.1:9",
        "--agent",
        "openai",
        "--out",
        str(tmp_path / "out"),
    )
    assert result.returncode == 2 and "needs --model-url and --model" in result.stderr
    (tmp_path / "traj.jsonl").write_text('{"id": "x", "reward": 1}\n')
    result = run("traj", "to-sft", str(tmp_path / "traj.jsonl"), "--out", str(tmp_path / "sft.parquet"))
    assert result.returncode == 2 and "no 'messages' list" in result.stderr
    result = run("serve", "--replay", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "replay source" in result.stderr


def test_serve_names_a_bad_cases_option(tmp_path):
    result = run("serve", "--data-root", str(tmp_path), "--cases", "mars=x.csv")
    assert result.returncode == 2 and "unknown environment 'mars'" in result.stderr
    result = run("serve", "--data-root", str(tmp_path), "--cases", "imaging=x.csv")
    assert result.returncode == 2 and "reads its cases from the data root" in result.stderr
    result = run("serve", "--data-root", str(tmp_path), "--cases", "clinic")
    assert result.returncode == 2 and "--cases takes ENV=PATH" in result.stderr


def test_options_of_another_environment_are_refused_by_name(tmp_path):
    result = run(
        "bank", "build", "--out", str(tmp_path / "b"), "--data-root", str(tmp_path), "--patient-noise", "0.3"
    )
    assert (
        result.returncode == 2
        and "--patient-noise (clinic) not taken by the imaging environment" in result.stderr
    )
    result = run("bank", "build", "--env", "casereason", "--out", str(tmp_path / "b"), "--mode", "sideways")
    assert result.returncode == 2 and "unknown mode 'sideways'" in result.stderr
    result = run("bank", "build", "--env", "clinic", "--out", str(tmp_path / "b"), "--split", "0.5,0.5")
    assert result.returncode == 2 and "--split" in result.stderr and "Traceback" not in result.stderr


def test_every_command_reads_a_bank_one_way_and_names_what_is_wrong(bank, tmp_path):
    """A truncated file, an unknown split, a missing file and a bank directory: rollouts, eval and bank
    validate refuse (or accept) them alike, exit 2 with the file named and no traceback."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(bank, broken)
    whole = (broken / "test.parquet").read_bytes()
    (broken / "test.parquet").write_bytes(whole[: len(whole) // 2])
    server = ("--server", "http://127.0.0.1:9")
    for args in (
        ("rollouts", "--bank", str(broken), "--split", "test", "--server-url", server[1]),
        (
            "eval",
            "--bank",
            str(broken / "test.parquet"),
            *server,
            "--agent",
            "random",
            "--out",
            str(tmp_path / "o"),
        ),
    ):
        result = run(*args)
        assert result.returncode == 2, result.stderr
        assert f"{broken / 'test.parquet'} is not a readable parquet file" in result.stderr
        assert "case-env bank build" in result.stderr and "Traceback" not in result.stderr
        assert result.stderr.count("is not a readable parquet") == 1
    assert not (tmp_path / "o").exists()

    result = run("rollouts", "--bank", str(bank), "--split", "trian", "--server-url", server[1])
    assert result.returncode == 2 and f"{bank} has no split 'trian'; it has train, val, test" in result.stderr

    result = run("bank", "validate", str(tmp_path / "nowhere.parquet"))
    assert result.returncode == 1 and f"bank {tmp_path / 'nowhere.parquet'} does not exist" in result.stderr
    result = run("bank", "validate", str(bank))  # a directory: each of its splits
    assert result.returncode == 0, result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == [
        str(bank / f"{split}.parquet") for split in ("train", "val", "test")
    ]


def test_serve_refuses_a_busy_port_and_an_empty_root_naming_the_fix(dataset, tmp_path):
    import socket

    empty = tmp_path / "empty"
    empty.mkdir()
    result = run("serve", "--data-root", str(empty))
    assert result.returncode == 2 and f"data root {empty} is empty" in result.stderr
    assert "case-env synth --out" in result.stderr and "Traceback" not in result.stderr

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run("serve", "--data-root", str(dataset), "--port", str(port))
    assert result.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "--port or CASE_ENV_PORT" in result.stderr and "Errno" not in result.stderr


def test_every_option_names_its_default_and_flags_read_as_flags():
    """Every option that takes a value says its default (or that it is required), in one plain style;
    a flag is shown as a flag, not as `<bool>`."""
    import typer

    from case_env.cli import app
    from case_env.verl import options, sft

    root = typer.main.get_command(app)

    def commands(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from commands(sub, [*path, name])
        else:
            yield " ".join(path), command

    launchers = {  # scripts/train_*.sh and `case-env train run|preflight`, which hand their arguments on
        "train_grpo.sh": options.grpo_command(options.recipes()),
        "train preflight": options.grpo_command(options.recipes(), preflight=True),
        "train_sft.sh": sft.sft_command(sft.sft_recipes()),
    }
    silent, seen = [], 0
    for path, command in [*commands(root, []), *launchers.items()]:
        context = type(root).context_class(command, info_name=path)
        for option in command.params:
            if option.param_type_name != "option" or option.is_flag or option.name == "help":
                continue
            seen += 1
            record = option.get_help_record(context)
            text = record[1] if record else ""
            if not option.required and "default" not in text.lower() and "required" not in text:
                silent.append(f"{path} {option.opts[0]}")
    assert seen > 130 and not silent, silent

    shown = run("synth", "--help").stdout
    assert "<bool>" not in shown and "--force " in shown and "[default: 10]" in shown
    assert "ukb-dicom" in shown and "[default: clinic csv, imaging nifti]" in " ".join(shown.split())


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["-m", "case_env.verl.grpo", "--help"], None),
        (["-m", "case_env.verl.grpo", "--data", "/nowhere", "--dry-run"], "--model"),
        (["-m", "case_env.verl.grpo", "--data", "/nowhere", "--model", "m", "--dry-run"], "does not exist"),
        (
            ["-m", "case_env.cli", "train", "preflight", "--data", "/nowhere", "--model", "m"],
            "does not exist",
        ),
        (["-m", "case_env.cli", "rollouts", "--bank", "/nowhere"], "bank /nowhere does not exist"),
        (
            [
                "-m",
                "case_env.cli",
                "eval",
                "--bank",
                "/nowhere",
                "--server",
                "http://127.0.0.1:9",
                "--agent",
                "x",
                "--out",
                "/tmp/unused",
            ],
            "unknown agent 'x'",
        ),
    ],
)
def test_argument_and_path_errors_answer_before_verl_or_torch_is_imported(command, named):
    """A wrong argument or path is named before the seconds verl and torch take to import: checked by what
    the interpreter imported (`-X importtime`), not by a clock."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *command], capture_output=True, text=True, timeout=300
    )
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "import time:" in line
    }
    said = (
        "\n".join(line for line in result.stderr.splitlines() if "import time:" not in line) + result.stdout
    )
    assert result.returncode == (0 if named is None else 2), said
    assert named is None or named in said
    assert not {"verl", "torch", "transformers", "ray"} & imported, said


def test_envs_lists_tools_in_lines_a_terminal_shows_and_parts_only_when_asked():
    listed = run("envs").stdout
    assert "  tools (69): ask_patient, xray" in listed and "parts:" not in listed
    assert max(len(line) for line in listed.splitlines()) <= 100
    verbose = run("envs", "--verbose").stdout
    assert "  parts: Data, " in verbose and "    exam_score: the exams: MedExAgent's tool match" in verbose
    # each reward as the weighted sum of its components, MedExAgent's weights the clinic's defaults
    assert "  reward: score = 1 dx + 0.5 exam_score - 0.1 cost + 0 format (defaults;" in listed
    assert "  reward: score = 1 acc + 0 rubric (defaults;" in listed


def test_rollouts_print_their_table_and_one_notice(dataset, bank):
    """What the demo shows of a rollout run: the table, the audit notice once (not once per server worker),
    no line of verl's dataset."""
    result = run(
        "rollouts", "--bank", str(bank), "--split", "train", "--data-root", str(dataset), "--per-source", "1"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    shown = (result.stdout + result.stderr).splitlines()
    assert shown.count("audit log disabled (set CASE_ENV_AUDIT_LOG or --audit-log)") == 1
    assert not [line for line in shown if "dataset len" in line or "examples/s" in line]
    # the demo's table in the README: the same columns, the data sources in the same order
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").splitlines()
    table = readme[readme.index("data source           n  reward  accuracy  format ok  calls    ok  infra") :]
    header = next(line for line in shown if line.startswith("data source"))
    assert header.split() == table[0].split()
    ran = [line for line in result.stdout.splitlines() if re.match(r"\w+_opsd\s+\d+\s", line)]
    assert [line.split()[0] for line in ran] == [line.split()[0] for line in table[1 : 1 + len(ran)]]


def test_train_preflight_offers_only_what_the_checks_take():
    shown = run("train", "preflight", "--help").stdout
    assert "--model" in shown and "--dry-run" not in shown and "--skip-preflight" not in shown
    refused = run("train", "preflight", "--model", "m", "--data", "/nowhere", "--dry-run")
    assert refused.returncode == 2 and "unknown option(s) --dry-run" in refused.stderr


def test_every_command_line_is_written_with_typer():
    """One command-line framework: `case-env`, the launchers, the benchmarks' helpers and scripts/ all read
    their options with typer (case_env/core/commands.py), none with argparse."""
    top = Path(__file__).resolve().parents[1]
    sources = [
        p
        for folder in ("case_env", "scripts", "tools", "examples", "integrations")
        for p in (top / folder).rglob("*.py")
    ]
    assert len(sources) > 150
    with_argparse = [
        str(p.relative_to(top))
        for p in sources
        if re.search(r"^\s*(import|from) argparse\b", p.read_text(encoding="utf-8"), re.M)
    ]
    assert not with_argparse


def test_bank_build_gives_its_rows_reward_weights_and_refuses_a_component_the_reward_lacks(tmp_path):
    import pyarrow.parquet as pq

    from case_env.reward import score_row

    root, out = tmp_path / "root", tmp_path / "bank"
    assert run("synth", "--env", "casereason", "--out", str(root), "--patients", "12").returncode == 0
    weights = ("--reward-weights", "recall=0.25")
    built = run("bank", "build", "--env", "casereason", "--data-root", str(root), "--out", str(out), *weights)
    assert built.returncode == 0, built.stderr
    rows = pq.read_table(out / "train.parquet").to_pylist()
    extras = [json.loads(r["extra_info"]) for r in rows]
    assert extras and all(e["reward_weights"] == {"recall": 0.25} for e in extras)
    assert json.loads((out / "bank.json").read_text())["reward_weights"] == {"recall": 0.25}
    # the row's weight counts: a quarter of the recall joins the credit of the right first answer
    truth = rows[0]["reward_model"]["ground_truth"]
    text = f"<think>{' '.join(extras[0]['casereason']['statements'])}</think><answer>{truth}</answer>"
    scored = score_row(rows[0]["data_source"], text, truth, extras[0])
    assert scored["credit"] == 1.0 and scored["recall"] > 0
    assert scored["score"] == pytest.approx(1.0 + 0.25 * scored["recall"])
    wrong = run(
        *("bank", "build", "--env", "casereason", "--data-root", str(root), "--out", str(tmp_path / "x")),
        *("--reward-weights", "recal=1"),
    )
    assert wrong.returncode == 2 and not (tmp_path / "x").exists()
    assert "the case-reasoning reward has no component 'recal'; choose among credit, recall" in wrong.stderr
