"""Check 13 (issue 31): no record is lost for another's fault. A call whose arguments nested 300 levels was
accepted at 84b9f1d; the next flush of the episode log failed on it and dropped every call of that flush,
another episode's successful `read_report` among them, and a GET at that moment answered 500. Such a call
is refused at the door now, and each call is its own write to the store, before its answer leaves."""

from __future__ import annotations

import json

import httpx

from case_env.server.models import MAX_DEPTH, MAX_NODES
from tests.server_harness import live_server


def nested(levels: int) -> dict:
    value: dict = {"organ": "liver"}
    for _ in range(levels):
        value = {"a": value}
    return value


def test_a_deeply_nested_call_is_refused_and_the_other_episodes_call_is_kept(dataset, tmp_path):
    with live_server(dataset, tmp_path) as server, httpx.Client(base_url=server.url) as client:
        ok = client.post(
            "/v1/tools/read_report",
            json={"episode_id": "kept", "patient_id": "case0001", "arguments": {"visit": "baseline"}},
        )
        assert ok.status_code == 200 and ok.json()["ok"]
        body = {"episode_id": "deep", "patient_id": "case0002", "arguments": nested(300)}
        assert len(json.dumps(body)) < 2_500  # the call: 1,897 bytes
        refused = client.post("/v1/tools/get_organ_volume", json=body)
        assert refused.status_code == 422
        assert (
            f"arguments: Value error, nested deeper than {MAX_DEPTH} levels"
            in refused.json()["error"]["message"]
        )
        wide = {
            "episode_id": "wide",
            "patient_id": "case0002",
            "arguments": {"organ": ["x"] * (MAX_NODES + 1)},
        }
        assert f"more than {MAX_NODES} values" in client.post("/v1/tools/get_organ_volume", json=wide).text
        kept = client.get("/v1/episodes/kept")
        assert kept.status_code == 200 and [c["tool"] for c in kept.json()["calls"]] == ["read_report"]


def test_each_acknowledged_call_is_in_the_log_before_its_answer(dataset, tmp_path):
    """No tick, no batch: a call's answer means its record is in the store, whichever way it is read."""
    with live_server(dataset, tmp_path) as server, httpx.Client(base_url=server.url) as client:
        for n in range(20):
            body = {"episode_id": "each", "patient_id": "case0001", "arguments": {"visit": "baseline"}}
            assert client.post("/v1/tools/read_report", json=body).json()["ok"]
            logged = client.get("/v1/episodes/each").json()
            assert logged["calls_total"] == n + 1 and logged["calls"][-1]["seq"] == n + 1
