"""Check 13 (issue 31): no record is lost for another's fault. A call whose arguments nested 300 levels was
accepted at 84b9f1d; the next flush of the episode log failed on it and dropped every call of that flush,
another episode's successful `read_report` among them, and a GET at that moment answered 500."""

from __future__ import annotations

import json

import httpx

from case_env.server.episodes import Call, EpisodeLog
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


def test_a_call_the_log_cannot_write_is_reported_and_the_rest_of_the_flush_written(tmp_path, caplog):
    """Behind the boundary (a tool that records what it was given), the log itself keeps the others."""
    store = EpisodeLog(tmp_path / "episodes.sqlite", idle_s=100.0, max_episodes=10, max_calls=8)
    for episode, patient in (("kept", "case0001"), ("deep", "case0002")):
        store.bind(episode, patient, now=1000.0)
    store.record("kept", "case0001", Call("read_report", {"visit": "baseline"}, "ok", 200, 1.0, None), 1000.0)
    store.record(
        "deep", "case0002", Call("get_organ_volume", nested(300), "invalid_arguments", 200, 1.0, None), 1000.0
    )
    store.record("deep", "case0002", Call("list_visits", {}, "ok", 200, 1.0, None), 1000.0)
    assert store.flush() == 3
    assert [c["tool"] for c in store.get("kept")["calls"]] == ["read_report"]
    deep = store.get("deep")["calls"]
    assert [c["tool"] for c in deep] == ["get_organ_volume", "list_visits"]
    assert deep[0]["arguments"]["_unrecorded"].startswith("the arguments could not be written")
    assert deep[1]["arguments"] == {}
    assert "get_organ_volume call's arguments could not be written" in caplog.text
    store.close()
