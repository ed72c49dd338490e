"""The reliability suite: each test is one check of issue 7 and records its figures in reliability.json.

`make test` runs it at CI scale (a few minutes); `make reliability` runs it at full scale
(`CASE_ENV_RELIABILITY=full`) and writes `reliability.json` (`CASE_ENV_RELIABILITY_OUT`). The figures are
recorded before a check asserts, so a failed check still reports what it measured, with `passed: false`.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SCALE = os.environ.get("CASE_ENV_RELIABILITY", "ci")
if SCALE not in ("ci", "full"):
    raise pytest.UsageError(f"CASE_ENV_RELIABILITY must be ci or full, not {SCALE!r}")


def explore(max_examples: int, **overrides) -> settings:
    """Hypothesis settings of this suite: at CI scale the examples are derived from the test (the same on
    every run, so CI is red only when the code changed); at full scale they are drawn afresh each run."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=SCALE == "ci",
        suppress_health_check=list(HealthCheck),
        **overrides,
    )


def size(ci: int, full: int) -> int:
    """The size of a check at this run's scale."""
    return full if SCALE == "full" else ci


class Report:
    def __init__(self) -> None:
        self.checks: dict[str, dict] = {}
        self.started = time.time()

    def check(self, name: str) -> dict:
        return self.checks.setdefault(name, {"passed": None})

    def document(self) -> dict:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
        return {
            "scale": SCALE,
            "commit": commit or None,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "duration_s": round(time.time() - self.started, 1),
            "passed": all(c["passed"] for c in self.checks.values()),
            "summary": {
                name: {"passed": check["passed"], **{k: check.get(k) for k in HEADLINES.get(name, [])}}
                for name, check in sorted(self.checks.items())
            },
            "checks": self.checks,
        }


# The figures the issue asks for, repeated at the top of reliability.json for a reader in a hurry.
HEADLINES = {
    "maximal_score_bodies_neither_block_the_worker_nor_exceed_the_bound": [
        "healthz_worst_ms",
        "score_statuses",
    ],
    "scope_and_held_calls_survive_a_crash_with_the_default_database": [
        "rebound_after_restart",
        "calls_kept",
        "burst_lost",
        "loss_window_ms",
    ],
    "fuzz": ["requests", "status_5xx", "schema_failures"],
    "hostile_input": ["requests", "status_5xx"],
    "reward_hacking": ["adversarial_completions", "scored_above_zero"],
    "scope_and_auth": [
        "scope_attempts",
        "scope_attempts_refused",
        "unauthenticated_attempts_refused",
        "tokens_in_logs",
        "audit_matches_calls",
    ],
    "overload": ["concurrent_calls", "p99_ms", "status_counts", "adapter_calls_completed"],
    "crash_and_restart": ["trajectories", "trajectories_completed"],
    "soak": ["calls", "rss_start_mb", "rss_end_mb", "fds_start", "fds_end", "episodes_live_peak"],
    "corrupt_data": ["other_patients_answers_changed", "damaged_calls_that_failed_as_required", "status_500"],
}
REPORT = Report()


@pytest.fixture
def figures(request) -> dict:
    """The figures of this check (named after the test), filled in by the test; `passed` is set from the
    test's outcome."""
    name = request.node.name.removeprefix("test_")
    record = REPORT.check(name)
    request.node._reliability_record = record
    return record


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    record = getattr(item, "_reliability_record", None)
    if record is not None and (report.when == "call" or report.failed):
        record["passed"] = report.passed if report.when == "call" else False
    return report


def pytest_sessionfinish(session):
    if not REPORT.checks:
        return
    out = os.environ.get("CASE_ENV_RELIABILITY_OUT")
    path = Path(out) if out else Path(session.config._tmp_path_factory.getbasetemp()) / "reliability.json"
    path.write_text(json.dumps(REPORT.document(), indent=2) + "\n", encoding="utf-8")
    session.config._reliability_path = path


def pytest_terminal_summary(terminalreporter, config):
    path = getattr(config, "_reliability_path", None)
    if path is not None:
        terminalreporter.write_line(f"reliability figures: {path}")


def json_values(text: st.SearchStrategy[str], size: int = 3, leaves: int = 8) -> st.SearchStrategy:
    """Any JSON value (finite numbers), its strings and keys drawn from `text`."""
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
        lambda inner: st.lists(inner, max_size=size) | st.dictionaries(text, inner, max_size=size),
        max_leaves=leaves,
    )
