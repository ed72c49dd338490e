"""The HTTP contract: errors by status and message, scope, auth, overload, deadlines, episodes, audit,
metrics and OpenAPI, against the real server under uvicorn on loopback."""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from openapi_spec_validator import validate
from pydantic import BaseModel, ConfigDict, Field

from case_env.bench.process import ServerProcess, free_port
from case_env.core import registry
from case_env.core.tools import ToolResult, ToolSpec, function_parameters
from case_env.envs.imaging.data import layout
from case_env.medicine.exams import EXAMS
from tests.server_harness import live_server, with_tools
from tests.test_data_store import SUB, copy_patient


class SlowArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = Field(0.5, ge=0, le=10, description="How long the call takes.")


def _slow(ctx, args: SlowArgs) -> ToolResult:
    time.sleep(args.seconds)
    return ToolResult(f"slept {args.seconds} s")


SLOW = ToolSpec(
    "slow_tool",
    "Takes a while.",
    ("anatomist",),
    SlowArgs,
    _slow,
    function_parameters("slow_tool", SlowArgs),
)
WITH_SLOW = [with_tools("imaging", {**registry.get("imaging").tools, "slow_tool": SLOW})]


def post(url: str, tool: str, patient: str = "case0001", episode: str = "e-1", headers=None, **arguments):
    body = {"episode_id": episode, "patient_id": patient, "arguments": arguments}
    return httpx.post(f"{url}/v1/tools/{tool}", json=body, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def server(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("api")) as live:
        yield live


def audit_lines(server) -> list[dict]:
    path = server.state.settings.audit_log
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("tool", "arguments", "code", "message"),
    [
        (
            "no_such_tool",
            {},
            "unknown_tool",
            "unknown tool 'no_such_tool'; available tools: compare_organ_volume",
        ),
        (
            "get_organ_volume",
            {"organ": "liver", "visit": "ses-01"},
            "invalid_arguments",
            "visit must be one of baseline, follow_up, not 'ses-01'",
        ),
        ("get_organ_volume", {"visit": "baseline"}, "invalid_arguments", "missing argument 'organ'"),
        (
            "get_organ_volume",
            {"organ": "liver", "visit": "baseline", "patient_id": "case0002"},
            "invalid_arguments",
            "unknown argument 'patient_id' (valid arguments: organ, visit)",
        ),
        (
            "get_organ_volume",
            {"organ": "brain", "visit": "baseline"},
            "unknown_organ",
            "organ 'brain' is not segmented for this patient at baseline; available: liver, spleen",
        ),
        (
            "render_slice",
            {"visit": "baseline", "sequence": "water", "plane": "axial", "position": 140},
            "invalid_arguments",
            "position is out of range",
        ),
        (
            "render_slice",
            {"visit": "baseline", "sequence": "t2", "plane": "axial"},
            "invalid_arguments",
            "sequence must be one of water, fat, in, opp",
        ),
        (
            "render_comparison",
            {"sequence": "fat", "plane": "oblique"},
            "invalid_arguments",
            "plane must be one of axial, coronal, sagittal",
        ),
        ("compare_organ_volume", {"organ": 7}, "invalid_arguments", "organ: input should be a valid string"),
    ],
)
def test_model_errors_are_ok_false_with_a_usable_message(server, tool, arguments, code, message):
    response = post(server.url, tool, episode=f"model-errors-{tool}", **arguments)
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is False and body["error"]["code"] == code
    assert message in body["text"] and body["text"] == body["error"]["message"]
    assert "\n" not in body["text"] and "Traceback" not in body["text"]


def test_service_errors_use_status_codes(server, dataset):
    unknown = post(server.url, "list_visits", patient="case9999", episode="svc-1")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_patient"
    for patient in ("../../etc/passwd", "case0001/../case0002", "x" * 200, "case\u00e9", "case\x000001"):
        response = post(server.url, "list_visits", patient=patient, episode="svc-2")
        assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_request"
    garbage = httpx.post(
        f"{server.url}/v1/tools/list_visits",
        content=b"{not json",
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert garbage.status_code == 422 and "not valid JSON" in garbage.json()["error"]["message"]
    missing = httpx.post(f"{server.url}/v1/tools/list_visits", json={"patient_id": "case0001"}, timeout=10)
    assert missing.status_code == 422 and "episode_id" in missing.json()["error"]["message"]
    huge = httpx.post(
        f"{server.url}/v1/tools/list_visits",
        timeout=10,
        json={"episode_id": "svc-3", "patient_id": "case0001", "arguments": {"x": "y" * 100_000}},
    )
    assert huge.status_code == 413
    for response in (unknown, garbage, missing, huge):
        assert str(dataset) not in response.text and "Traceback" not in response.text


def test_an_episode_is_held_to_its_patient(server):
    assert post(server.url, "list_visits", patient="case0001", episode="scoped").status_code == 200
    refused = post(server.url, "list_visits", patient="case0002", episode="scoped")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "scope_violation"
    assert "case0002" not in refused.text
    assert (
        post(
            server.url,
            "get_organ_volume",
            patient="case0001",
            episode="scoped",
            organ="liver",
            visit="baseline",
        ).status_code
        == 200
    )
    episode = httpx.get(f"{server.url}/v1/episodes/scoped", timeout=10).json()
    assert episode["patient_id"] == "case0001"
    assert [c["tool"] for c in episode["calls"]] == ["list_visits", "get_organ_volume"]
    call = episode["calls"][1]
    assert call["arguments"] == {"organ": "liver", "visit": "baseline"} and call["status"] == "ok"
    assert call["http_status"] == 200 and call["latency_ms"] > 0 and len(call["output_digest"]) == 32
    assert httpx.get(f"{server.url}/v1/episodes/never-seen", timeout=10).status_code == 404


def test_every_call_is_audited_including_refused_ones(server):
    before = len(audit_lines(server))
    post(server.url, "list_visits", patient="case0003", episode="audited")  # 200
    post(server.url, "list_visits", patient="case0004", episode="audited")  # 403
    post(server.url, "list_visits", patient="case9999", episode="audited-2")  # 404
    post(server.url, "no_such_tool", patient="case0003", episode="audited")  # ok false
    httpx.post(f"{server.url}/v1/tools/list_visits", json={"patient_id": "case0003"}, timeout=10)  # 422
    undecodable = httpx.post(
        f"{server.url}/v1/tools/read_report",
        content=b'{"a": "\xff"}',
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert undecodable.status_code == 422
    lines = audit_lines(server)[before:]
    assert [(line["tool"], line["status"], line["http_status"]) for line in lines] == [
        ("list_visits", "ok", 200),
        ("list_visits", "scope_violation", 403),
        ("list_visits", "unknown_patient", 404),
        ("no_such_tool", "unknown_tool", 200),
        ("list_visits", "invalid_request", 422),
        ("read_report", "invalid_request", 422),
    ]
    assert lines[0]["episode_id"] == "audited" and lines[0]["patient_id"] == "case0003"
    assert all({"time", "arguments", "latency_ms"} <= set(line) for line in lines)


def test_metrics(server):
    post(
        server.url,
        "render_slice",
        patient="case0005",
        episode="metered",
        visit="baseline",
        sequence="fat",
        plane="coronal",
    )
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'case_env_tool_calls_total{status="ok",tool="render_slice"}' in text
    assert 'case_env_tool_latency_seconds_bucket{le="0.5",tool="render_slice"}' in text
    assert "case_env_calls_in_flight 0.0" in text
    cache = next(line for line in text.splitlines() if line.startswith("case_env_cache_bytes "))
    assert float(cache.split()[1]) > 1e6
    live = next(line for line in text.splitlines() if line.startswith("case_env_episodes_live "))
    assert float(live.split()[1]) >= 1


def test_published_metrics_equal_one_observation_per_call(monkeypatch):
    """Calls are tallied and published in batches; the exposition must be what prometheus_client gives when
    every call is observed on its own (bucket bounds included: a latency equal to a bound counts in it)."""
    from case_env.server.metrics import LATENCY_BUCKETS, Metrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    calls = [("render_slice", "ok", s) for s in (*LATENCY_BUCKETS, 0.0, 0.0031, 0.7, 45.0)]
    calls += [("list_visits", "ok", 0.0002)] * 5 + [("list_visits", "unknown_visit", 0.01)] * 2
    batched, single = Metrics(), Metrics()
    for tool, status, seconds in calls:
        batched.observe(tool, status, seconds)
        single.calls.labels(tool, status).inc()
        single.latency.labels(tool).observe(seconds)
    for result in ("hit", "miss", "miss", "shared"):
        batched.count_cache(result)
        single.response_cache.labels(result).inc()
    batched.publish()
    batched.observe("list_visits", "ok", 0.0002)  # a second batch adds to the first
    single.calls.labels("list_visits", "ok").inc()
    single.latency.labels("list_visits").observe(0.0002)

    def exposition(metrics: Metrics) -> dict[str, float]:
        lines = metrics.render().decode().splitlines()
        samples = [
            line.rpartition(" ") for line in lines if not line.startswith("#") and "_created" not in line
        ]
        return {series: float(value) for series, _, value in samples}

    # counts exactly; sums to rounding, since a batch adds its total where single calls add one by one
    assert exposition(batched) == pytest.approx(exposition(single), rel=1e-12)
    assert exposition(batched)['case_env_tool_latency_seconds_bucket{le="0.005",tool="render_slice"}'] == 4.0


def test_openapi_is_valid_and_complete(server):
    spec = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    validate(spec)
    assert {
        "/v1/tools",
        "/v1/tools/list_visits",
        "/v1/tools/ask_patient",
        "/v1/tools/submit_diagnosis",
        "/v1/episodes/{episode_id}",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(spec["paths"])
    # the document says what the server does (case_env/server/contract.py): a path per tool, its body with
    # its environment's context model or none, `env` one of the hosted environments, extra_info the rewards'
    assert "/v1/tools/{name}" not in spec["paths"]
    schemas = spec["components"]["schemas"]
    assert "context" not in schemas["ToolCall_imaging"]["properties"]
    assert {"$ref": "#/components/schemas/ClinicSetup"} in schemas["ToolCall_clinic"]["properties"][
        "context"
    ]["anyOf"]
    ask = spec["paths"]["/v1/tools/ask_patient"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    assert ask == {"$ref": "#/components/schemas/ToolCall_clinic"}
    (env,) = [p for p in spec["paths"]["/v1/tools"]["get"]["parameters"] if p["name"] == "env"]
    assert {"type": "string", "enum": ["casereason", "clinic", "imaging"]} in env["schema"]["anyOf"]
    extra = schemas["ScoreRequest"]["properties"]["extra_info"]["anyOf"]
    assert {"$ref": "#/components/schemas/RowExtra"} in extra
    assert set(schemas["RowExtra"]["properties"]) >= {"env", "case_env_tool_calls", "clinic", "casereason"}
    for model in (
        "ToolCallResponse",
        "ImagePayload",
        "ErrorInfo",
        "ErrorResponse",
        "ToolsResponse",
        "EpisodeResponse",
        "Call",
        "ReadyResponse",
    ):
        assert model in schemas, model
    assert schemas["ToolCall_imaging"]["properties"]["episode_id"]["description"]
    responses = spec["paths"]["/v1/tools/list_visits"]["post"]["responses"]
    assert {"200", "401", "403", "404", "422", "429", "503", "504"} <= set(responses)


def test_tool_listing(server):
    listing = httpx.get(f"{server.url}/v1/tools", timeout=10).json()
    tools = {t["name"]: t for t in listing["tools"]}
    assert set(tools) == {
        "list_visits",
        "get_organ_volume",
        "compare_organ_volume",
        "render_slice",
        "render_comparison",
        "read_report",
        "get_clinical_context",
        "ask_patient",
        "order_exam",
        "submit_diagnosis",
        *EXAMS,
    }
    assert all(tools[name]["personas"] == ["clinician"] for name in EXAMS)
    assert tools["ask_patient"]["personas"] == tools["order_exam"]["personas"] == ["clinician"]
    assert tools["submit_diagnosis"]["personas"] == ["diagnostician"]
    assert tools["list_visits"]["personas"] == ["anatomist", "radiologist", "consultant"]
    assert tools["compare_organ_volume"]["personas"] == ["anatomist"]
    assert tools["render_comparison"]["personas"] == ["radiologist"]
    assert tools["read_report"]["personas"] == ["consultant"]
    assert tools["get_organ_volume"]["personas"] == ["anatomist", "consultant"]
    assert tools["render_slice"]["personas"] == ["anatomist", "radiologist"]
    for name, tool in tools.items():
        function = tool["schema"]["function"]
        # MedExAgent's exam tools carry its own one-line descriptions; ours say more
        described = (
            function["description"] == EXAMS[name].description
            if name in EXAMS
            else len(function["description"]) > 60
        )
        assert tool["schema"]["type"] == "function" and described
        for prop in function["parameters"]["properties"].values():
            assert set(prop) <= {"type", "description", "enum"} and prop["description"]
            assert prop["type"] in ("string", "number", "integer", "boolean")
        assert "patient_id" not in function["parameters"]["properties"]
    render = tools["render_slice"]["schema"]["function"]["parameters"]
    assert render["required"] == ["visit", "sequence", "plane"]
    assert render["properties"]["sequence"]["enum"] == ["water", "fat", "in", "opp"]
    assert len(listing["schema_version"]) == 12


def test_auth(dataset, tmp_path):
    token = "tok-" + "s3cret" * 4
    with live_server(dataset, tmp_path, token=token) as live:
        good = {"Authorization": f"Bearer {token}"}
        assert post(live.url, "list_visits", episode="a1").status_code == 401
        denied = post(live.url, "list_visits", episode="a1", headers={"Authorization": "Bearer wrong"})
        assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
        assert denied.json()["error"]["code"] == "unauthorized"
        assert (
            post(live.url, "list_visits", episode="a1", headers={"Authorization": token}).status_code == 401
        )
        assert post(live.url, "list_visits", episode="a1", headers=good).status_code == 200
        score = {"data_source": "x", "solution_str": "<answer>B</answer>", "ground_truth": "B"}
        assert httpx.post(f"{live.url}/v1/score", json=score, timeout=10).status_code == 401
        assert httpx.post(f"{live.url}/v1/score", json=score, headers=good, timeout=10).json()["score"] == 1.0
        for path in ("/v1/tools", "/v1/episodes/a1", "/metrics", "/readyz", "/openapi.json"):
            assert httpx.get(live.url + path, timeout=10).status_code == 401
            assert httpx.get(live.url + path, headers=good, timeout=10).status_code == 200
        assert httpx.get(live.url + "/healthz", timeout=10).status_code == 200  # the one open route
        audit = (tmp_path / "audit.jsonl").read_text()
    assert token not in audit and "s3cret" not in audit
    statuses = [json.loads(line)["http_status"] for line in audit.splitlines()]
    assert statuses == [401, 401, 401, 200]


def test_overload_answers_429_with_retry_after(dataset, tmp_path):
    with live_server(dataset, tmp_path, environments=WITH_SLOW, max_in_flight=2, max_queued=0) as live:

        def one(n: int) -> httpx.Response:
            return post(live.url, "slow_tool", episode=f"load-{n}", seconds=1.0)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(one, range(8)))
        statuses = sorted(r.status_code for r in responses)
        assert statuses.count(200) >= 2 and statuses.count(429) >= 4 and set(statuses) <= {200, 429}
        for response in responses:
            if response.status_code == 429:
                assert response.headers["retry-after"] == "1"
                assert response.json()["error"]["code"] == "overloaded"
        assert post(live.url, "slow_tool", episode="after", seconds=0.0).status_code == 200


def test_a_burst_waits_in_the_queue_until_it_is_full_or_waited_too_long(dataset, tmp_path):
    settings = {"max_in_flight": 2, "max_queued": 3, "queue_wait_s": 1.5}
    with live_server(dataset, tmp_path, environments=WITH_SLOW, **settings) as live:

        def one(n: int) -> tuple[int, float]:
            started = time.monotonic()
            # distinct arguments: identical calls in flight would share one answer
            response = post(live.url, "slow_tool", episode=f"queue-{n}", seconds=1.0 + n / 1000)
            return response.status_code, time.monotonic() - started

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(8)))
        assert live.state.admission.active == 0 and live.state.admission.queued == 0
    statuses = sorted(status for status, _ in results)
    # 2 run at once and 3 wait: the first 2 waiters get slots after 1 s, the third would wait 2 s > 1.5 s;
    # the 3 that found the queue full are refused at once.
    assert statuses == [200, 200, 200, 200, 429, 429, 429, 429], results
    assert sorted(t for s, t in results if s == 429)[:3] == pytest.approx([0, 0, 0], abs=0.5)
    assert max(t for s, t in results if s == 429) == pytest.approx(1.5, abs=0.5)


def test_a_slow_call_hits_the_deadline(dataset, tmp_path):
    with live_server(dataset, tmp_path, environments=WITH_SLOW, tool_deadline_s=0.3) as live:
        started = time.monotonic()
        response = post(live.url, "slow_tool", episode="slow", seconds=2.0)
        assert time.monotonic() - started < 1.5
        assert response.status_code == 504
        assert response.json()["error"] == {
            "code": "deadline_exceeded",
            "message": "the call took longer than 0.3 s",
        }
        assert post(live.url, "list_visits", episode="fast").status_code == 200
        episode = httpx.get(f"{live.url}/v1/episodes/slow", timeout=10).json()
        assert (
            episode["calls"][0]["status"] == "deadline_exceeded" and episode["calls"][0]["http_status"] == 504
        )


def test_an_internal_failure_answers_json_500_without_a_traceback(dataset, tmp_path, monkeypatch):
    """A call whose bookkeeping fails answers the one JSON 500, whether its body came with a Content-Length
    or streamed."""

    def streamed(url: str, tool: str, body: dict) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/tools/{tool}",
            content=iter([json.dumps(body).encode()]),
            headers={"content-type": "application/json"},
            timeout=30,
        )

    body = {"episode_id": "twin", "patient_id": "case0002", "arguments": {"section": "history"}}
    with live_server(dataset, tmp_path) as live:
        sized = httpx.post(f"{live.url}/v1/tools/get_clinical_context", json=body, timeout=30)
        full = streamed(live.url, "get_clinical_context", body)
        assert sized.status_code == full.status_code == 200
        drop = {"latency_ms"}
        assert {k: v for k, v in sized.json().items() if k not in drop} == {
            k: v for k, v in full.json().items() if k not in drop
        }
        assert httpx.get(f"{live.url}/v1/episodes/twin", timeout=10).json()["calls_total"] == 2

        def broken(*args, **kwargs):
            raise RuntimeError("metrics down")

        monkeypatch.setattr(live.state.metrics, "observe", broken)
        failed = [
            httpx.post(f"{live.url}/v1/tools/list_visits", json=body, timeout=30),
            streamed(live.url, "list_visits", body),
        ]
        assert [r.status_code for r in failed] == [500, 500]
        assert (
            failed[0].json()
            == failed[1].json()
            == {
                "ok": False,
                "error": {"code": "internal", "message": "internal error; the failure was logged"},
            }
        )
        assert "Traceback" not in failed[0].text + failed[1].text


def test_not_ready_without_patients(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with live_server(empty, tmp_path) as live:
        ready = httpx.get(f"{live.url}/readyz", timeout=10)
        assert ready.status_code == 503 and ready.json()["reason"] == "the data root holds no cases"
        response = post(live.url, "list_visits")
        assert response.status_code == 503 and response.json()["error"]["code"] == "not_ready"
        assert response.headers["retry-after"] == "1"
        assert httpx.get(f"{live.url}/healthz", timeout=10).status_code == 200


def test_unreadable_data_fails_for_that_patient_only(dataset, tmp_path):
    root = copy_patient(dataset, tmp_path / "root")
    shutil.copytree(dataset / "sub-0002", root / "sub-0002")
    for base in (layout.SEGMENTATIONS, layout.REPORTS):
        shutil.copytree(dataset / base / "sub-0002", root / base / "sub-0002")
    (root / layout.PARTICIPANTS).write_text((dataset / layout.PARTICIPANTS).read_text())
    path = root / layout.channel_image(SUB, "ses-01", "fat")
    path.write_bytes(path.read_bytes()[:1000])
    with live_server(root, tmp_path) as live:
        broken = post(live.url, "render_slice", episode="b1", visit="baseline", sequence="fat", plane="axial")
        assert broken.status_code == 503 and broken.json()["error"]["code"] == "data_unavailable"
        assert str(root) not in broken.text and ".nii" not in broken.text
        fine = post(
            live.url,
            "render_slice",
            patient="case0002",
            episode="b2",
            visit="baseline",
            sequence="fat",
            plane="axial",
        )
        assert fine.status_code == 200 and fine.json()["ok"]
        same_patient = post(live.url, "get_organ_volume", episode="b1", organ="liver", visit="baseline")
        assert same_patient.status_code == 200  # the volumes table does not need the broken image


def test_episodes_expire_when_idle(dataset, tmp_path):
    with live_server(dataset, tmp_path, episode_idle_s=0.4) as live:
        assert post(live.url, "list_visits", episode="brief").status_code == 200
        time.sleep(1.2)
        assert httpx.get(f"{live.url}/v1/episodes/brief", timeout=10).status_code == 404
        assert post(live.url, "list_visits", patient="case0002", episode="brief").status_code == 200


def test_fastapis_own_telemetry_is_off_unless_asked_for(monkeypatch):
    """FastAPI's per-request OpenTelemetry check is off by default; CASE_ENV_OTEL turns it back on. A
    FastAPI without native telemetry gets no `telemetry` argument at all."""
    from case_env.server import app as server_app
    from case_env.server.settings import ServerSettings

    assert server_app._telemetry(ServerSettings(otel=True)) == {}
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        assert server_app._telemetry(ServerSettings()) == {}
        return
    quiet = server_app.create_app()
    assert not any(quiet._telemetry[k] for k in ("tracing", "metrics", "logs"))
    monkeypatch.setenv("CASE_ENV_OTEL", "true")
    assert all(server_app.create_app()._telemetry[k] for k in ("tracing", "metrics", "logs"))


def _serve(dataset: Path, tmp: Path, *args: str, token: str | None = None) -> ServerProcess:
    """The real `case-env serve` command with these flags (which take precedence over the environment)."""
    port = int(args[args.index("--port") + 1])
    command = [sys.executable, "-m", "case_env.cli", "serve", "--data-root", str(dataset), *args]
    env = {"CASE_ENV_CACHE_DIR": str(tmp / "cache"), "CASE_ENV_TOKEN": token}
    return ServerProcess(tmp / "server.log", env, port=port, command=command)


def test_serve_with_text_environments_only_needs_no_data_root(tmp_path):
    """Case files of a text environment are all `serve` needs: no imaging root, no data root at all."""
    from case_env.envs.clinic.synth import make_cases, write_csv

    cases = tmp_path / "clinic.csv"
    write_csv(make_cases(12, 0), cases)
    missing = tmp_path / "no-root"
    command = [sys.executable, "-m", "case_env.cli", "serve", "--data-root", str(missing)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "give case files with --cases" in refused.stderr
    command += ["--cases", f"clinic={cases}", "--port", str(free_port())]
    env = {"CASE_ENV_CACHE_DIR": str(tmp_path / "cache"), "CASE_ENV_TOKEN": None}
    port = int(command[-1])
    with ServerProcess(tmp_path / "server.log", env, port=port, command=command) as server:
        assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200
        case_id = registry.get("clinic").load_cases([cases]).cases[0].case_id
        body = {"episode_id": "text-only", "patient_id": case_id, "arguments": {"question": "What hurts?"}}
        reply = httpx.post(f"{server.url}/v1/tools/ask_patient", json=body, timeout=10).json()
        assert reply["ok"] and reply["text"]
        listed = httpx.get(f"{server.url}/v1/tools", timeout=10).json()
        assert {"imaging", "clinic"} <= {e["name"] for e in listed["environments"]}  # imaging holds no case


def test_serve_refuses_an_exposed_address_without_a_token(dataset, tmp_path):
    server = _serve(dataset, tmp_path, "--host", "0.0.0.0", "--port", str(free_port()))
    with pytest.raises(RuntimeError, match="server exited with 2"):
        server.start()
    stderr = server.log.read_text()
    assert "refusing to listen on 0.0.0.0 without a token" in stderr and "Traceback" not in stderr


def test_serve_runs_the_real_command(dataset, tmp_path):
    port = free_port()
    token = "serve-token-123"
    audit = tmp_path / "audit.jsonl"
    args = ("--host", "0.0.0.0", "--port", str(port), "--audit-log", str(audit))
    with _serve(dataset, tmp_path, *args, token=token) as server:
        response = post(
            server.url,
            "get_organ_volume",
            episode="cli",
            headers={"Authorization": f"Bearer {token}"},
            organ="spleen",
            visit="follow_up",
        )
        assert response.status_code == 200 and response.json()["ok"]
        assert (
            post(server.url, "get_organ_volume", episode="cli", organ="spleen", visit="follow_up").status_code
            == 401
        )
    assert len(audit.read_text().splitlines()) == 2


def test_workers_share_episodes_and_metrics(dataset, tmp_path):
    with _serve(dataset, tmp_path, "--port", str(free_port()), "--workers", "2") as server:
        url = server.url
        assert post(url, "list_visits", episode="shared").status_code == 200
        # Fresh connections spread over both workers; every one must know the binding.
        refused = [
            post(url, "list_visits", patient="case0002", episode="shared").status_code for _ in range(12)
        ]
        assert refused == [403] * 12
        # each worker publishes its calls every quarter second, the one answering a scrape before it answers
        wanted = 'case_env_tool_calls_total{status="scope_violation",tool="list_visits"} 12.0'
        deadline = time.monotonic() + 5
        while wanted not in (metrics := httpx.get(f"{url}/metrics", timeout=10).text):
            assert time.monotonic() < deadline, metrics
            time.sleep(0.1)
        assert httpx.get(f"{url}/v1/episodes/shared", timeout=10).json()["calls_total"] == 1


def test_score_route_is_the_reward_function(server):
    from case_env.reward import score_row

    solution = "I measured it.\n<tool_response>\nAnswer: C\n</tool_response>\nSo the answer is B.\n<answer>B</answer>"
    for truth in ("B", "C"):
        body = {"data_source": "vista3d_opsd", "solution_str": solution, "ground_truth": truth}
        response = httpx.post(f"{server.url}/v1/score", json=body, timeout=10)
        assert response.status_code == 200
        expected = score_row("vista3d_opsd", solution, truth)
        common = {k: expected.pop(k) for k in ("score", "acc", "pred", "format_ok")}
        assert response.json() == {"env": "imaging", **common, "components": expected}
    bad = httpx.post(f"{server.url}/v1/score", json={"solution_str": "x"}, timeout=10)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"


def test_repeated_calls_answer_from_the_response_cache_until_the_data_changes(dataset, tmp_path):
    import dataclasses

    from case_env.envs.imaging.settings import ImagingSettings as DataSettings
    from case_env.server.app import create_app
    from case_env.server.settings import ServerSettings
    from tests.server_harness import serve_app

    root = copy_patient(dataset, tmp_path / "root")
    runs = {"render_slice": 0, "read_report": 0}
    tools = registry.get("imaging").tools

    def counted(spec: ToolSpec) -> ToolSpec:
        def run(ctx, args):
            answer = spec.run(ctx, args)  # counted once answered: an attempt refused on the loop is none
            runs[spec.name] += 1
            return answer

        return dataclasses.replace(spec, run=run)

    specs = {name: counted(spec) if name in runs else spec for name, spec in tools.items()}
    app = create_app(
        ServerSettings(host="127.0.0.1", port=0),
        DataSettings(data_root=root, cache_dir=tmp_path / "cache", stat_ttl_s=0),
        [with_tools("imaging", specs)],
    )
    arguments = {"visit": "baseline", "sequence": "fat", "plane": "coronal", "position": 40}
    with serve_app(app) as live:
        first = post(live.url, "render_slice", episode="g0", **arguments).json()
        # a GRPO group: eight rollouts ask the same thing at once, with the position spelt differently
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            group = list(
                pool.map(
                    lambda n: post(
                        live.url, "render_slice", episode=f"g{n + 1}", **{**arguments, "position": 40.0}
                    ).json(),
                    range(8),
                )
            )
        assert all(g["ok"] and g["images"][0]["data_b64"] == first["images"][0]["data_b64"] for g in group)
        assert runs["render_slice"] == 1 and live.state.responses.stats().hits >= 1
        other = post(live.url, "render_slice", episode="g9", **{**arguments, "position": 60}).json()
        assert other["ok"] and runs["render_slice"] == 2
        # errors are not remembered: a bad call is checked every time
        assert not post(live.url, "render_slice", episode="g0", **{**arguments, "plane": "oblique"}).json()[
            "ok"
        ]
        before = post(live.url, "read_report", episode="r0", visit="baseline").json()["text"]
        assert post(live.url, "read_report", episode="r1", visit="baseline").json()["text"] == before
        assert runs["read_report"] == 1
        path = root / layout.report(SUB, "ses-01", "md")
        path.write_text(path.read_text() + "\nAddendum: reviewed again.\n")
        after = post(live.url, "read_report", episode="r2", visit="baseline").json()["text"]
        assert after != before and after.endswith("Addendum: reviewed again.") and runs["read_report"] == 2
