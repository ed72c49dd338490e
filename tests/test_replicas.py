"""Replicas on several hosts share only Redis. Two real `case-env serve` processes with cache directories of
their own and no file in common stand for two hosts, a real `redis-server` between them: an episode bound
through one is held to its case through the other, goes on through the other with its history when the
first is killed, keeps every binding across a Redis restart, and meets 503 (never a new binding) while
Redis is down."""

from __future__ import annotations

import httpx
import pytest

from case_env.bench.process import RedisServer, ServerProcess
from case_env.envs.casereason.cases import read_file
from case_env.envs.casereason.synth import write_cases
from case_env.envs.clinic.synth import make_cases, write_csv


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replica-cases")
    write_csv(make_cases(6, seed=0), folder / "clinic" / "clinic.csv")
    write_cases(4, 0, folder / "casereason" / "c.jsonl")
    return folder


@pytest.fixture(scope="module")
def hosts(dataset, cases, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replicas")
    redis = RedisServer(tmp / "redis").start()
    servers = []
    for name in ("host-a", "host-b"):
        settings = {
            "CASE_ENV_DATA_ROOT": str(dataset),
            "CASE_ENV_CACHE_DIR": str(tmp / name / "cache"),  # nothing on disk in common
            "CASE_ENV_STORE": redis.url,
            "CASE_ENV_EPISODE_DB": None,
            "CASE_ENV_AUDIT_LOG": str(tmp / name / "audit.jsonl"),
            "CASE_ENV_CLINIC_CASES": str(cases / "clinic"),
            "CASE_ENV_CASEREASON_CASES": str(cases / "casereason"),
            "CASE_ENV_TOKEN": None,
        }
        servers.append(ServerProcess(tmp / name / "server.log", settings).start())
    try:
        yield redis, servers
    finally:
        for server in servers:
            server.stop()
        redis.kill()


def call(server: ServerProcess, tool: str, episode: str, case: str, arguments=None, context=None):
    body = {"episode_id": episode, "patient_id": case, "arguments": arguments or {}}
    if context is not None:
        body["context"] = context
    return httpx.post(f"{server.url}/v1/tools/{tool}", json=body, timeout=30)


def logged(server: ServerProcess, episode: str) -> list[str]:
    return [c["tool"] for c in httpx.get(f"{server.url}/v1/episodes/{episode}", timeout=30).json()["calls"]]


def test_an_episode_bound_through_one_host_is_held_to_its_case_through_the_other(hosts):
    _, (a, b) = hosts
    assert call(a, "list_visits", "shared", "case0001").json()["ok"]
    refused = call(b, "list_visits", "shared", "case0002")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "scope_violation"
    assert call(b, "read_report", "shared", "case0001", {"visit": "baseline"}).json()["ok"]
    assert logged(a, "shared") == logged(b, "shared") == ["list_visits", "read_report"]
    # racing first calls through both hosts: one case wins, on both
    for n in range(10):
        first = call(a, "list_visits", f"race-{n}", "case0001")
        second = call(b, "list_visits", f"race-{n}", "case0002")
        assert {first.status_code, second.status_code} == {200, 403}


def test_a_conversation_goes_on_through_the_other_host_with_its_history(hosts, cases):
    _, (a, b) = hosts
    case = read_csv_case(cases)
    questions = ["What brings you in?", "Anything else?", "Since when?"]
    # the same conversation on one host alone, for what each answer should be
    alone = [call(a, "ask_patient", "alone", case, {"question": q}).json()["text"] for q in questions]
    assert len(set(alone)) == 3  # each answer follows the ones before it
    split = [call(a, "ask_patient", "split", case, {"question": questions[0]}).json()["text"]]
    a.kill()  # SIGKILL: no shutdown, nothing flushed
    try:
        split += [
            call(b, "ask_patient", "split", case, {"question": q}).json()["text"] for q in questions[1:]
        ]
        assert split == alone
        assert logged(b, "split") == ["ask_patient"] * 3
        # an attempt budget spent on one host is spent on the other
        reason = read_file(cases / "casereason" / "c.jsonl").cases[0]
        budget = {"attempts": 2}
        first = call(b, "submit_diagnosis", "budget", reason.case_id, {"diagnosis": "gout"}, budget)
        assert first.json()["ok"]
    finally:
        a.start()
    last = call(a, "submit_diagnosis", "budget", reason.case_id, {"diagnosis": "lupus"}, budget)
    assert "last of 2 attempts" in last.json()["text"]


def read_csv_case(cases) -> str:
    from case_env.envs.clinic.cases import read_csv

    return read_csv(next((cases / "clinic").glob("*.csv"))).cases[0].case_id


def test_a_redis_restart_keeps_every_binding(hosts):
    redis, (a, b) = hosts
    for n in range(20):
        assert call(a if n % 2 else b, "list_visits", f"kept-{n}", "case0001").json()["ok"]
    redis.stop()  # a clean shutdown: Redis writes what it holds
    redis.start()
    for n in range(20):
        refused = call(b if n % 2 else a, "list_visits", f"kept-{n}", "case0002")
        assert refused.status_code == 403, refused.text
        assert logged(a, f"kept-{n}") == ["list_visits"]


def test_while_redis_is_down_the_hosts_answer_503_and_bind_nothing(hosts):
    redis, (a, b) = hosts
    assert call(a, "list_visits", "before", "case0001").json()["ok"]
    redis.kill()
    try:
        for server in (a, b):
            for episode, case in (("before", "case0002"), ("new-while-down", "case0001")):
                down = call(server, "list_visits", episode, case)
                assert down.status_code == 503 and down.json()["error"]["code"] == "not_ready"
                assert down.headers["retry-after"] == "1"
            ready = httpx.get(f"{server.url}/readyz", timeout=30)
            assert ready.status_code == 503 and "Redis" in ready.json()["reason"]
            assert httpx.get(f"{server.url}/v1/episodes/before", timeout=30).status_code == 503
    finally:
        redis.start()
    assert call(b, "list_visits", "before", "case0002").status_code == 403  # still bound, never rebound
    assert httpx.get(f"{b.url}/v1/episodes/new-while-down", timeout=30).status_code == 404
