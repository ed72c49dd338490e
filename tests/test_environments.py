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
from pydantic import Field

from case_env.core import registry
from case_env.core.calls import FIELD, Call, call_text, chat_call, executed_calls, written_calls
from case_env.core.tools import ToolError, ToolResult, tool
from case_env.medicine.exams import EXAMS
from case_env.reward import score_row
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


def test_no_function_is_longer_than_80_lines():
    """A function reads in one sitting: past 80 lines (its signature counted), split it where it changes
    subject."""
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 80
    ]
    assert not long, long


@pytest.mark.parametrize("layer", ["server", "verl", "eval", "bench", "lm", "trl"])
def test_generic_layers_import_no_environment(layer):
    imported = _imports(PACKAGE / layer) | _imports(PACKAGE / "core")
    assert not {m for m in imported if m.startswith("case_env.envs")}


# The generic layers, read as text (code, comments and docstrings): what a newcomer reads there must not be
# any environment's. Domain words are those of the built-in environments' tools and rows.
GENERIC = [
    "core",
    "server",
    "verl",
    "eval",
    "bench",
    "lm",
    "trl",
    "cli",
    "reward.py",
    "settings.py",
]
DOMAIN_WORDS = {"organ", "visit", "lesion", "exam", "diagnosis", "diagnoses", "imaging", "dixon", "mri"}
# Names that are also plain English: found only when quoted as a name ("other", `other`), since the clinic's
# exam tool `other` (MedExAgent's) would otherwise forbid the word.
ENGLISH = {"other"}
# Where a generic layer may name one, and why: kept short.
ALLOWED: set[tuple[str, str]] = set()


def _leak_words() -> set[str]:
    from case_env.core.parts import evaluation_of

    words = set(DOMAIN_WORDS)
    for env in registry.environments().values():
        words |= {env.name, *env.tools, *env.personas, *env.personas.data_sources}
        words |= {str(c) for c in evaluation_of(env).fault_codes}
    return {w.lower() for w in words}


def _leaks(paths: list[Path]) -> list[str]:
    """Every occurrence of a forbidden word in the files, as `path:line: word in text`."""
    import re

    words = _leak_words()
    plain = sorted(words - ENGLISH, key=len, reverse=True)
    bare = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, plain)) + r")s?(?![A-Za-z0-9_])", re.I)
    quoted = re.compile(r"[\"'`](" + "|".join(map(re.escape, sorted(ENGLISH & words))) + r")[\"'`]")
    found = []
    for path in paths:
        where = str(path.relative_to(PACKAGE)) if path.is_relative_to(PACKAGE) else path.name
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in [*bare.finditer(line), *quoted.finditer(line)]:
                if (where, match.group(1).lower()) not in ALLOWED:
                    found.append(f"{where}:{number}: {match.group(1)!r} in {line.strip()[:100]}")
    return found


def test_generic_layers_name_no_environment_its_tools_sources_personas_codes_or_domain():
    paths = []
    for part in GENERIC:
        found = [PACKAGE / part] if part.endswith(".py") else sorted((PACKAGE / part).rglob("*"))
        paths += [p for p in found if p.suffix in (".py", ".jinja", ".yaml", ".md")]
    assert len(paths) > 60  # the layers were read
    leaks = _leaks(paths)
    assert not leaks, f"{len(leaks)} leak(s):\n" + "\n".join(leaks[:20])


def test_the_leak_check_catches_each_kind_of_leak(tmp_path):
    planted = tmp_path / "planted.py"
    lines = [
        "# calls render_slice",  # a tool
        "x = 'medboard_opsd'",  # a data source
        "# for the Radiologist",  # a persona
        "code = 'unknown_organ'",  # a fault code
        "# the organs of a visit",  # domain words, plural too
        'name = "other"',  # a tool that is an English word, quoted
        "# every other call",  # the English word, not a leak
    ]
    planted.write_text("\n".join(lines) + "\n")
    found = _leaks([planted])
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "4", "5", "5", "6"], found


def test_the_serving_core_is_small_and_parts_are_declared():
    from case_env.core.environment import Environment
    from case_env.core.parts import Data

    members = {n for n in [*vars(Environment), *Environment.__annotations__] if not n.startswith("_")}
    assert len(members) <= 13, sorted(members)
    assert all(isinstance(env, Data) for env in registry.environments().values())
    assert len(registry.PARTS) <= 6


def test_the_architecture_page_shows_the_parts_table_the_registry_generates():
    page = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    table = registry.parts_table()
    assert "| `TextCases` |" in table and "| `Training` |" in table
    assert table in page, (
        "paste `python -c 'from case_env.core import registry; print(registry.parts_table())'`"
    )


def test_the_glossary_names_code_that_exists_once():
    """Each name in the glossary's code column is a class or function defined exactly once in case_env/ (one
    type per concept: a second `Episode` would fail here), each `Class.member` a member of it, each path real."""
    import ast
    import re

    page = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    glossary = page.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in glossary.splitlines() if line.startswith("| ") and not line.startswith("| word")]
    defined: dict[str, int] = {}
    for module in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.col_offset == 0:
                defined[node.name] = defined.get(node.name, 0) + 1
    checked = 0
    for row in rows:
        code = row.rstrip(" |").rsplit(" | ", 1)[1]
        for name in re.findall(r"`([^`]+)`", code):
            if "/" in name:  # a path under case_env/ (or the top level's personas/)
                path = name.replace("<env>", "imaging")
                assert (PACKAGE / path).exists() or (PACKAGE.parent / path).exists(), name
            elif name.startswith("@"):
                assert defined.get(name[1:]) == 1, name
            elif "." in name:  # Class.member
                owner, member = name.split(".", 1)
                assert defined.get(owner) == 1, owner
                assert any(hasattr(env, member) for env in registry.environments().values()), name
            elif name[:1].isupper():
                assert defined.get(name) == 1, f"{name} is defined {defined.get(name, 0)} times"
            else:  # a field or setting name (`case_id`, `context`)
                continue
            checked += 1
    assert checked >= 20


def test_an_environment_is_refused_at_load_for_a_half_declared_part_or_a_misspelt_persona():
    from case_env.core.environment import Environment, Score
    from case_env.core.parts import Data, Evaluation
    from case_env.core.personas import load_personas

    class HalfDone(Environment, Data):  # declares Data but no build_bank
        name, title, summary = "half", "half", "half"

        def open_cases(self, data):
            return None

        async def score(self, solution_str, ground_truth, extra_info):
            return Score(0.0, 0.0, "", False)

    with pytest.raises(TypeError, match="build_bank"):
        HalfDone()
    with pytest.raises(TypeError, match="names baselines but defines no policy_factory"):

        class NoNurse(Evaluation):  # a baseline no one can make
            baselines = ("nurse",)

    tools = dict(registry.get("imaging").tools)
    misspelt = tools["read_report"].__class__(
        **{**tools["read_report"].__dict__, "personas": ("consultent",)}
    )
    with pytest.raises(TypeError, match=r"read_report names persona 'consultent'.*consultant"):
        load_personas("case_env.personas.imaging", "imaging", {**tools, "read_report": misspelt})


def test_a_tool_is_a_typed_function_whose_signature_and_docstring_are_its_schema():
    @tool(personas=("nurse",), inline=True)
    def pulse(ctx, times: int = Field(1, ge=1, le=3, description="How often.")) -> ToolResult:
        """Take the pulse,
        repeatedly."""
        return ToolResult(f"{ctx} x{times}")

    assert pulse.name == "pulse" and pulse.description == "Take the pulse, repeatedly." and pulse.inline
    assert pulse.parameters == {
        "type": "object",
        "properties": {"times": {"type": "integer", "description": "How often."}},
        "required": [],
    }
    assert pulse.run("ctx", pulse.parse({"times": 2})).text == "ctx x2"
    # personas named with an environment's StrEnum are kept as the plain names, as module tools had them
    render = registry.get("imaging").tools["render_slice"]
    assert render.personas == ("anatomist", "radiologist") and {type(p) for p in render.personas} == {str}
    with pytest.raises(ToolError, match="times is out of range"):
        pulse.parse({"times": 9})

    def bare(ctx, n: int = 3) -> ToolResult:
        """No Field, so no description."""
        return ToolResult("")

    with pytest.raises(TypeError, match="argument 'n' needs a Field"):
        tool(personas=("nurse",))(bare)


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
        "data_source": e.personas.data_sources[0],
        "solution_str": "<think>x</think>\n<answer>A</answer>",
        "ground_truth": "A",
        "extra_info": {"env": env},
    }
    reply = httpx.post(f"{server.url}/v1/score", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    payload = reply.json()
    assert {"env", "score", "acc", "pred", "format_ok"} <= set(payload) and payload["env"] == env
    expected = score_row(body["data_source"], body["solution_str"], "A", body["extra_info"])
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
        Call(tool=n, arguments=a, status="invalid_arguments" if r == "invalid order" else "ok").record()
        for n, a, r in turns
    ]
    scores = [
        score_row("x", hermes, truth, extra),
        score_row("x", xml, truth, extra),
        score_row("x", xml.replace("<tool_call>", "<tool_call_gone>"), truth, {**extra, FIELD: ran}),
    ]
    assert scores[0] == scores[1] == scores[2]
    assert scores[0]["acc"] == 1.0
    # the executed calls decide: a transcript that lost its calls scores as the calls that ran say
    recorded = [Call.model_validate(r) for r in ran]
    assert executed_calls("", recorded, registry.tool_parameters)[0].tool == turns[0][0]


def test_qwen3_coder_values_take_the_schema_types():
    text = call_text("render_slice", {"visit": "baseline", "position": 40, "overlay": True}, "qwen3_coder")
    assert "<function=render_slice>" in text and "<parameter=position>\n40\n</parameter>" in text
    ((name, args),) = written_calls(
        text, {"render_slice": registry.all_tools()["render_slice"].parameters["properties"]}
    )
    assert (name, args) == ("render_slice", {"visit": "baseline", "position": 40, "overlay": True})
    ((_, untyped),) = written_calls(text)
    assert untyped == {"visit": "baseline", "position": "40", "overlay": "true"}  # strings without a schema


@pytest.mark.parametrize("deep", ["[" * 50_000 + "]" * 50_000, "1+" * 5_000 + "1"])
def test_calls_nested_past_the_interpreters_stack_are_unparsed_not_a_crash(deep):
    # deeper than Python's stack: json and ast raise RecursionError, which verl's parsers catch as a bad call
    hermes = f'<tool_call>{{"name": "compare_organ_volume", "arguments": {{"organ": {deep}}}}}</tool_call>'
    assert written_calls(hermes) == []
    xml = f"<tool_call>\n<function=f>\n<parameter=organs>\n{deep}\n</parameter>\n</function>\n</tool_call>"
    assert written_calls(xml, {"f": {"organs": {"type": "array"}}}) == [("f", {"organs": deep})]
    assert chat_call({"function": {"name": "f", "arguments": deep}}) == ("f", None)
