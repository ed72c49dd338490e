"""Check 14 (issue 31): a sequential case-reasoning episode spends its attempts on the server's own count.

At 84b9f1d the budget was whatever the client's `context` said: three wrong submissions and a right one, each
sent with `{"attempts": 1, "submissions": []}`, were all judged, the last "Correct". The server now counts the
episode's judged submissions from its own log of the episode, on whichever worker the call lands, and a
client's claim about earlier submissions is refused by name: the history is not the client's to send."""

from __future__ import annotations

import json

import httpx
import pytest

from case_env.bench.process import ServerProcess
from case_env.envs.casereason.cases import read_file
from case_env.envs.casereason.synth import write_cases
from tests.server_harness import live_server
from tests.test_clinic_server import env

WRONG = ["gout", "sarcoidosis", "lupus"]


def submit(url: str, episode: str, case: str, diagnosis: str, context: dict) -> str:
    body = {
        "episode_id": episode,
        "patient_id": case,
        "arguments": {"diagnosis": diagnosis},
        "context": context,
    }
    with httpx.Client() as client:  # a connection per call: with several workers any of them may answer
        reply = client.post(f"{url}/v1/tools/submit_diagnosis", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["text"]


def lying_client(url: str, case: dict, episode: str, attempts: int) -> list[str]:
    """Three wrong submissions, then the right one, each sent as if it were the episode's first."""
    context = {"attempts": attempts}
    return [submit(url, episode, case["case_id"], d, context) for d in [*WRONG, case["diagnosis"]]]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reasoning")
    write_cases(4, 0, folder / "cases" / "c.jsonl")
    rows = [
        {"case_id": c.case_id, "diagnosis": c.diagnosis}
        for c in read_file(folder / "cases" / "c.jsonl").cases
    ]
    assert len(rows) == 4 and not {r["diagnosis"].lower() for r in rows} & set(WRONG)
    return folder / "cases", rows


def test_a_client_that_sends_no_submissions_still_spends_the_budget(dataset, tmp_path, cases):
    folder, rows = cases
    with env(CASE_ENV_CASEREASON_CASES=folder), live_server(dataset, tmp_path) as server:
        one = lying_client(server.url, rows[0], "k1", attempts=1)
        assert one[0] == "Incorrect. That was the last of 1 attempts; give your final answer."
        assert one[1:] == ["No attempts left (1 of 1 used). Give your final answer."] * 3
        three = lying_client(server.url, rows[1], "k3", attempts=3)
        assert (
            three[1]
            == "Incorrect. Reconsider the case and submit a different diagnosis (2 of 3 attempts used)."
        )
        assert three[3] == "No attempts left (3 of 3 used). Give your final answer."
        # an honest episode with the budget left gets its answer judged
        honest = submit(server.url, "k5", rows[2]["case_id"], rows[2]["diagnosis"], {"attempts": 5})
        assert honest == "Correct. Give this diagnosis as your final answer."
        # the old lie, "nothing was submitted before", is refused by name
        lie = {"episode_id": "k1", "patient_id": rows[0]["case_id"], "arguments": {"diagnosis": "x"}}
        lie["context"] = {"attempts": 1, "submissions": []}
        refused = httpx.post(f"{server.url}/v1/tools/submit_diagnosis", json=lie, timeout=30)
        assert refused.status_code == 422 and "context.submissions" in refused.text


def test_the_count_holds_across_workers(dataset, tmp_path, cases):
    folder, rows = cases
    server = ServerProcess(
        tmp_path / "server.log",
        {
            "CASE_ENV_DATA_ROOT": str(dataset),
            "CASE_ENV_CASEREASON_CASES": str(folder),
            "CASE_ENV_TOKEN": None,
        },
        command=None,
    )
    server.command += ["--workers", "2"]
    server.start()
    try:
        answers = [lying_client(server.url, rows[3], f"w{n}", attempts=2) for n in range(4)]
    finally:
        server.stop()
    for replies in answers:
        assert replies[2:] == ["No attempts left (2 of 2 used). Give your final answer."] * 2, json.dumps(
            replies
        )
