"""Check 12 (issue 31): a row whose `extra_info` its reward cannot read is the caller's fault (422 with the field
path), at `/v1/score` and in the reward entry points alike; a 500 that must close the connection says so.

At 84b9f1d 26 of 34 malformed rows answered 500, and the keep-alive connection was dropped without
`Connection: close`. The rows below are the issue's, then rows drawn by hypothesis from JSON values placed
under every key the three rewards read."""

from __future__ import annotations

import re

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from case_env.core import registry
from case_env.reward import RowError, score_row
from tests.reliability.conftest import explore, size
from tests.reliability.conftest import json_values as any_json
from tests.server_harness import live_server

SOURCES = {"imaging": "vista3d_opsd", "clinic": "medexagent", "casereason": "casereason"}
ISSUE_ROWS = [
    ({"env": "clinic", "clinic": 5}, "extra_info.clinic: Input should be a valid dictionary"),
    ({"env": "clinic", "clinic": "not json"}, "extra_info.clinic: Value error, a string that is not JSON"),
    ({"env": "clinic", "clinic": {"reward": {"profile": "nope"}}}, "extra_info.clinic.reward.profile:"),
    ({"env": "clinic", "clinic": {"exams": 5}}, "extra_info.clinic.exams: Input should be a valid list"),
    ({"env": "casereason", "casereason": {"attempts": "abc"}}, "extra_info.casereason.attempts:"),
    ({"env": "casereason", "reward_weights": {"recall": None}}, "extra_info.reward_weights.recall:"),
    (  # a name no reward has, refused with the names there are
        {"env": "casereason", "reward_weights": {"recal": 0.5}},
        "extra_info.reward_weights.recal.[key]: Input should be 'acc', 'cost', 'credit', 'dx', 'exam_score', "
        "'format', 'recall' or 'rubric'",
    ),
    (
        {"env": "casereason", "casereason": {"recall_weight": 0.5}},
        "extra_info.casereason: Value error, recall_weight is no longer read here: set "
        "extra_info.reward_weights.recall instead",
    ),
    (
        {"env": "casereason", "casereason": {"statements": [1, None, {}]}},
        "extra_info.casereason.statements.0: Input should be a valid string; "
        "extra_info.casereason.statements.1: Input should be a valid string; "
        "extra_info.casereason.statements.2: Input should be a valid string",
    ),
    ({"env": "imaging", "case_env_tool_calls": [5]}, "extra_info.case_env_tool_calls.0:"),
]
json_values = any_json(st.text(max_size=8))


def keys_read(env: str) -> list[str]:
    """Every key of the environment's reward model, nested ones as dotted paths."""
    out = []
    for name, field in registry.get(env).score_extra.model_fields.items():
        out.append(name)
        inner = next(
            (a for a in getattr(field.annotation, "__args__", ()) if hasattr(a, "model_fields")), None
        )
        out += [f"{name}.{sub}" for sub in getattr(inner, "model_fields", {})]
    return out


def place(env: str, path: str, value) -> dict:
    extra: dict = {"env": env}
    head, _, tail = path.partition(".")
    extra[head] = {tail: value} if tail else value
    return extra


@pytest.fixture(scope="module")
def server(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("rows")) as live:
        yield live


@pytest.mark.parametrize(("extra", "message"), ISSUE_ROWS)
def test_the_issues_rows_answer_422_naming_the_field(server, extra, message):
    body = {"data_source": SOURCES[extra["env"]], "solution_str": "<answer>B</answer>", "ground_truth": "B"}
    reply = httpx.post(f"{server.url}/v1/score", json={**body, "extra_info": extra})
    assert reply.status_code == 422 and message in reply.json()["error"]["message"]
    with pytest.raises(RowError, match=re.escape(message.split(":")[0])):
        score_row(body["data_source"], body["solution_str"], "B", extra)


@explore(size(150, 1500))
@given(data=st.data())
def test_drawn_rows_never_answer_500(server, data):
    env = data.draw(st.sampled_from(sorted(SOURCES)))
    extra = place(env, data.draw(st.sampled_from(keys_read(env))), data.draw(json_values))
    body = {"data_source": SOURCES[env], "solution_str": "[DIAGNOSIS: gout] <answer>B</answer>"}
    reply = httpx.post(f"{server.url}/v1/score", json={**body, "ground_truth": "B", "extra_info": extra})
    assert reply.status_code in (200, 422), (extra, reply.text)


def test_a_weight_of_another_environments_component_is_kept_and_not_read(server):
    """A recipe gives every row of a mixed bank the same weights: the clinic's `dx` on an imaging row changes
    nothing, as the /openapi.json schema (the union of every reward's names) says it is accepted."""
    body = {"data_source": "vista3d_opsd", "solution_str": "<answer>B</answer>", "ground_truth": "B"}
    plain = httpx.post(f"{server.url}/v1/score", json={**body, "extra_info": {}}).json()
    weighed = httpx.post(f"{server.url}/v1/score", json={**body, "extra_info": {"reward_weights": {"dx": 5}}})
    assert weighed.status_code == 200 and weighed.json()["score"] == plain["score"] == 1.0


def test_a_500_says_it_closes_the_connection(server, monkeypatch):
    env = registry.get("imaging")

    def broken(*args, **kwargs):
        raise RuntimeError("a reward that fails")

    monkeypatch.setattr(env, "score", broken)
    body = {"data_source": "vista3d_opsd", "solution_str": "x", "ground_truth": "B", "extra_info": {}}
    with httpx.Client() as client:
        reply = client.post(f"{server.url}/v1/score", json=body)
        assert reply.status_code == 500 and reply.headers["connection"] == "close"
        assert "Traceback" not in reply.text and reply.json()["error"]["code"] == "internal"
        assert client.get(f"{server.url}/healthz").status_code == 200  # a new connection, as announced


def test_bank_validate_reads_rows_with_the_same_model(tmp_path):
    """`case-env bank validate` names a malformed reward block of a built bank as /v1/score would."""
    import json

    import pyarrow.parquet as pq

    from case_env.core.bank import write
    from case_env.core.validate import validate
    from case_env.envs.clinic.bank import build
    from case_env.envs.clinic.noise import NoiseConfig
    from case_env.envs.clinic.synth import make_cases

    write(build(make_cases(10, 0), 0, (1.0, 0.0, 0.0), NoiseConfig()), tmp_path / "bank", {"env": "clinic"})
    table = pq.read_table(tmp_path / "bank" / "train.parquet").to_pylist()
    assert validate(tmp_path / "bank" / "train.parquet").ok
    extra = json.loads(table[0]["extra_info"])
    extra["clinic"]["reward"] = {"profile": "nope"}
    table[0]["extra_info"] = json.dumps(extra)
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(table), tmp_path / "broken.parquet")
    result = validate(tmp_path / "broken.parquet")
    assert not result.ok
    assert any(
        "extra_info.clinic.reward.profile: Input should be 'medexagent' or 'strict'" in p
        for p in result.problems
    )
