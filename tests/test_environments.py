"""The environment protocol and registry: every environment registered the same way, rows routed by their
environment, generic layers that never import one, POST /v1/score for every registered environment, and
tool calls counted the same from verl's tool_extra_fields and from hermes or qwen3_coder transcripts."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from case_env.core import registry
from case_env.core.calls import FIELD, ExecutedCall, call_text, executed_calls, written_calls
from case_env.medicine.exams import EXAMS
from case_env.reward import compute_score
from tests.server_harness import live_server

PACKAGE = Path(__file__).resolve().parents[1] / "case_env"
BUILT_IN = {"imaging", "clinic", "casereason"}


def test_the_built_in_environments_register_by_entry_point():
    from importlib.metadata import entry_points

    points = {p.name: p.value for p in entry_points(group=registry.GROUP)}
    assert set(points) >= BUILT_IN and set(registry.environments()) >= BUILT_IN
    assert points["clinic"] == "case_env.envs.clinic:ClinicEnvironment"
    tools = [t for env in registry.environments().values() for t in env.tools]
    assert len(tools) == len(set(tools))  # a tool belongs to exactly one environment
    assert registry.default().name == "imaging"
    assert registry.for_tool("ask_patient").name == "clinic" and registry.for_tool("nope") is None


def test_rows_are_routed_by_env_then_by_data_source():
    assert registry.for_row("anything", {"env": "casereason"}).name == "casereason"
    assert registry.for_row("clinic_pmc", {}).name == "clinic"
    assert registry.for_row("medboard_opsd").name == "imaging"
    assert registry.for_row("a CASE-Bench source nobody claims").name == "imaging"  # the default environment
    with pytest.raises(registry.RegistryError, match="unknown environment 'mars'; registered: "):
        registry.for_row("x", {"env": "mars"})


def _imports(folder: Path) -> set[str]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
    return found


@pytest.mark.parametrize("layer", ["server", "verl", "eval"])
def test_generic_layers_import_no_environment(layer):
    imported = _imports(PACKAGE / layer) | _imports(PACKAGE / "core")
    assert not {m for m in imported if m.startswith("case_env.envs")}
    text = "\n".join(p.read_text() for p in (PACKAGE / layer).rglob("*.py"))
    for name in BUILT_IN - {"imaging"}:  # 'imaging' is also an English word in comments
        assert f'"{name}"' not in text, f"{layer} names the {name} environment"


def test_case_env_envs_lists_every_environment():
    done = subprocess.run(
        [sys.executable, "-m", "case_env.cli", "envs", "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)["environments"]
    assert set(listed) >= BUILT_IN
    assert listed["imaging"]["personas"]["radiologist"] == ["medpanel_v2_opsd"]
    assert listed["clinic"]["tools"] == ["ask_patient", *EXAMS, "order_exam"]  # MedExAgent's 67 exam tools
    assert listed["casereason"]["data_sources"] == ["casereason"]


@pytest.fixture(scope="module")
def server(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("envs")) as live:
        yield live


@pytest.mark.parametrize("env", sorted(registry.environments()))
def test_score_answers_200_with_the_common_keys_for_every_environment(server, env):
    e = registry.get(env)
    body = {
        "data_source": e.data_sources[0],
        "solution_str": "<think>x</think>\n<answer>A</answer>",
        "ground_truth": "A",
        "extra_info": {"env": env},
    }
    reply = httpx.post(f"{server.url}/v1/score", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    payload = reply.json()
    assert {"env", "score", "acc", "pred", "format_ok"} <= set(payload) and payload["env"] == env
    expected = compute_score(body["data_source"], body["solution_str"], "A", body["extra_info"])
    assert {k: payload[k] for k in ("score", "acc", "pred", "format_ok")} == {
        k: expected[k] for k in ("score", "acc", "pred", "format_ok")
    }
    assert payload.get("components", {}) == {k: v for k, v in expected.items() if k not in payload}
    unknown = httpx.post(f"{server.url}/v1/score", json={**body, "extra_info": {"env": "mars"}}, timeout=30)
    names = " or ".join(", ".join(f"'{n}'" for n in sorted(registry.environments())).rsplit(", ", 1))
    message = f"extra_info.env: Input should be {names}"
    assert unknown.status_code == 422 and message in unknown.json()["error"]["message"]


def test_tools_are_listed_per_environment(server):
    everything = httpx.get(f"{server.url}/v1/tools", timeout=10).json()
    clinic = httpx.get(f"{server.url}/v1/tools", params={"env": "clinic"}, timeout=10).json()
    assert {t["name"] for t in clinic["tools"]} == {"ask_patient", "order_exam", *EXAMS}
    assert {t["env"] for t in clinic["tools"]} == {"clinic"}
    assert [e["name"] for e in clinic["environments"]] == ["clinic"]
    assert (
        clinic["schema_version"]
        == clinic["environments"][0]["schema_version"]
        != everything["schema_version"]
    )
    bad = httpx.get(f"{server.url}/v1/tools", params={"env": "mars"}, timeout=10)
    assert bad.status_code == 422 and "this server hosts" in bad.json()["error"]["message"]


def _episode(form: str, turns: list[tuple[str, dict, str]], final: str) -> str:
    parts = [
        f"{call_text(name, args, form)}\nuser\n<tool_response>\n{reply}\n</tool_response>"
        for name, args, reply in turns
    ]
    return "\n".join([*parts, final])


CLINIC = [
    ("ask_patient", {"question": "What brings you in?"}, "My chest hurts."),
    ("order_exam", {"exam": "xray", "region": "chest"}, "X-ray: consolidation."),
    ("order_exam", {"exam": "cbc"}, "CBC: leukocytosis."),
    ("order_exam", {"exam": "ct", "region": "chest", "contrast": "yes"}, "CT: lobar pneumonia."),
    ("order_exam", {"exam": "xray", "region": "moon"}, "invalid order"),  # refused by the server
]
CLINIC_EXTRA = {"env": "clinic", "clinic": {"exams": ['xray(region="chest")', "cbc()"]}}
REASON = [
    ("submit_diagnosis", {"diagnosis": "migraine"}, "Incorrect. Reconsider the case (1 of 4 attempts used)."),
    (
        "submit_diagnosis",
        {"diagnosis": "giant cell arteritis"},
        "Correct. Give this diagnosis as your final answer.",
    ),
]
REASON_EXTRA = {"env": "casereason", "casereason": {"mode": "sequential", "attempts": 4, "statements": []}}


@pytest.mark.parametrize(
    ("turns", "extra", "truth", "final"),
    [
        (
            CLINIC,
            CLINIC_EXTRA,
            "community-acquired pneumonia",
            "<answer>community-acquired pneumonia</answer>",
        ),
        (
            REASON,
            REASON_EXTRA,
            "Giant cell arteritis",
            "<think>jaw claudication</think>\n<answer>GCA</answer>",
        ),
    ],
)
def test_calls_count_the_same_from_executed_calls_hermes_and_qwen3_coder(turns, extra, truth, final):
    hermes = _episode("hermes", turns, final)
    xml = _episode("qwen3_coder", turns, final)
    assert [name for name, _ in written_calls(xml)] == [t[0] for t in turns]
    assert written_calls(xml) == written_calls(hermes) == [(name, args) for name, args, _ in turns]
    # verl's record of the same episode: the refused order has its error status, the others ran
    ran = [
        ExecutedCall(n, a, "invalid_arguments" if r == "invalid order" else "ok").record()
        for n, a, r in turns
    ]
    scores = [
        compute_score("x", hermes, truth, extra),
        compute_score("x", xml, truth, extra),
        compute_score("x", xml.replace("<tool_call>", "<tool_call_gone>"), truth, {**extra, FIELD: ran}),
    ]
    assert scores[0] == scores[1] == scores[2]
    assert scores[0]["acc"] == 1.0
    # the executed calls decide: a transcript that lost its calls scores as the calls that ran say
    assert executed_calls("", {FIELD: ran})[0].tool == turns[0][0]


def test_qwen3_coder_values_take_the_schema_types():
    text = call_text("render_slice", {"visit": "baseline", "position": 40, "overlay": True}, "qwen3_coder")
    assert "<function=render_slice>" in text and "<parameter=position>\n40\n</parameter>" in text
    ((name, args),) = written_calls(
        text, {"render_slice": registry.all_tools()["render_slice"].parameters["properties"]}
    )
    assert (name, args) == ("render_slice", {"visit": "baseline", "position": 40, "overlay": True})
    ((_, untyped),) = written_calls(text)
    assert untyped == {"visit": "baseline", "position": "40", "overlay": "true"}  # strings without a schema
