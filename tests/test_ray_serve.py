"""`case-env serve --ray --replicas 2` on a local Ray instance (CPU), its replicas sharing a real Redis:
they answer exactly what the plain server answers, hold every episode to one patient across replicas, go
on with an episode when a replica is killed, and answer 503 while Redis is down, binding nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from case_env.bench.process import RedisServer, free_port, wait_ready
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
def redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("ray-redis")).start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def ray_server(dataset, tmp_path_factory, redis):
    tmp = tmp_path_factory.mktemp("ray")
    port = free_port()
    env = {
        **os.environ,
        "CASE_ENV_CACHE_DIR": str(tmp / "cache"),
        "CASE_ENV_STORE": redis.url,
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


def test_a_killed_replica_leaves_its_episodes_to_the_other(ray_server):
    assert _call(ray_server, "list_visits", {}, "survivor", patient="case0002")["ok"]
    replicas = subprocess.run(["pgrep", "-f", "ServeReplica:case-env"], capture_output=True, text=True)
    pids = [int(p) for p in replicas.stdout.split()]
    assert len(pids) == 2, replicas.stdout
    os.kill(pids[0], signal.SIGKILL)
    refused, kept = [], []
    for _ in range(6):  # Ray's proxy sends them to the live replica (and starts another)
        refused.append(_call(ray_server, "list_visits", {}, "survivor", patient="case0001")["status"])
        kept.append(
            _call(ray_server, "read_report", {"visit": "baseline"}, "survivor", patient="case0002")["status"]
        )
    # never answered for another case; a call the dead replica held may fail, the episode goes on
    assert set(refused) <= {403, 500, 503} and refused.count(403) >= 4, refused
    assert set(kept) <= {200, 500, 503} and kept.count(200) >= 4, kept
    calls = httpx.get(f"{ray_server}/v1/episodes/survivor", timeout=60).json()["calls"]
    assert calls[0]["tool"] == "list_visits" and {c["tool"] for c in calls} <= {"list_visits", "read_report"}


def test_while_redis_is_down_the_replicas_answer_503(ray_server, redis):
    assert _call(ray_server, "list_visits", {}, "down", patient="case0001")["ok"]
    redis.kill()
    try:
        for _ in range(4):
            down = _call(ray_server, "list_visits", {}, "down", patient="case0002")
            assert down["status"] == 503 and down["error"]["code"] == "not_ready"
    finally:
        redis.start()
    assert _call(ray_server, "list_visits", {}, "down", patient="case0002")["status"] == 403
