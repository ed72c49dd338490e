"""`case-env serve --ray --replicas 2` on a local Ray instance (CPU) answers exactly what the plain server
answers, and holds every episode to one patient across replicas."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from case_env.bench.process import free_port, wait_ready
from tests.server_harness import live_server

CALLS = [
    ("list_visits", {}),
    ("get_organ_volume", {"organ": "liver", "visit": "follow_up"}),
    ("compare_organ_volume", {"organ": "spleen"}),
    ("read_report", {"visit": "baseline"}),
    ("render_slice", {"visit": "baseline", "sequence": "fat", "plane": "coronal", "overlay": True}),
    ("render_comparison", {"sequence": "water", "plane": "axial", "organ": "liver", "position": 40}),
    ("get_organ_volume", {"organ": "heart_of_gold", "visit": "baseline"}),  # a model fault, answered alike
]


@pytest.fixture(scope="module")
def ray_server(dataset, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    port = free_port()
    env = {
        **os.environ,
        "CASE_ENV_CACHE_DIR": str(tmp / "cache"),
        "RAY_ADDRESS": "",
        "RAY_DISABLE_USAGE_STATS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("CASE_ENV_TOKEN", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "case_env.cli",
            "serve",
            "--ray",
            "--replicas",
            "2",
            "--port",
            str(port),
            "--data-root",
            str(dataset),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, url, seconds=180)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(timeout=90) == 0
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise


def _call(url: str, tool: str, arguments: dict, episode: str, patient: str = "case0003") -> dict:
    body = {"episode_id": episode, "patient_id": patient, "arguments": arguments}
    response = httpx.post(f"{url}/v1/tools/{tool}", json=body, timeout=60)
    return {"status": response.status_code, **response.json()}


def test_ray_replicas_answer_the_same_tool_calls_as_the_plain_server(ray_server, dataset, tmp_path):
    with live_server(dataset, tmp_path) as plain:
        for n, (tool, arguments) in enumerate(CALLS):
            ours = _call(ray_server, tool, arguments, f"ray-{n}")
            theirs = _call(plain.url, tool, arguments, f"plain-{n}")
            assert (ours["status"], ours["ok"], ours["text"]) == (
                theirs["status"],
                theirs["ok"],
                theirs["text"],
            )
            assert [i["data_b64"] for i in ours["images"]] == [i["data_b64"] for i in theirs["images"]]
            assert ours["error"] == theirs["error"]


def test_episode_scope_holds_across_replicas(ray_server):
    assert _call(ray_server, "list_visits", {}, "scoped", patient="case0001")["ok"]
    # many calls, so both replicas get some: none may read another patient under this episode
    for _ in range(12):
        refused = _call(ray_server, "list_visits", {}, "scoped", patient="case0002")
        assert refused["status"] == 403 and refused["error"]["code"] == "scope_violation"
        assert _call(ray_server, "list_visits", {}, "scoped", patient="case0001")["ok"]
