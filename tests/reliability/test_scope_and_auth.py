"""Check 4: scope and auth on `case-env serve` with a token and two workers (so a binding made on one worker
must hold on the other).

- Every /v1 route and /metrics, as listed by /openapi.json, refuses a missing, wrong or scheme-less token.
- An episode bound to one patient can never read another, whatever the tool, including when many first
  calls for one fresh episode race across workers with different patients.
- Neither the right token nor the wrong ones appear in the server's log or the audit log, and the server's
  log holds no patient id (that is the audit log's job).
- The audit log has exactly one line per tool call, refused ones included, with the status the client saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter

import httpx

from case_env.bench.process import ServerProcess
from case_env.core import registry
from case_env.envs.clinic.noise import NoisePlan
from case_env.envs.clinic.patient import RulePatient
from case_env.envs.clinic.synth import make_cases, write_csv
from case_env.envs.imaging.data.store import PatientStore
from case_env.medicine.exams import EXAMS
from tests.reliability.conftest import size

TOKEN = "scope-token-7f3a9c1e5b"
WRONG = ["scope-token-7f3a9c1e5c", "Bearer", TOKEN[:-1], TOKEN + "x"]
GOOD = {"Authorization": f"Bearer {TOKEN}"}
ARGUMENTS = {
    "list_visits": {},
    "get_clinical_context": {"section": "history"},
    "read_report": {"visit": "follow_up"},
    "get_organ_volume": {"organ": "liver", "visit": "baseline"},
    "compare_organ_volume": {"organ": "spleen"},
    "render_slice": {"visit": "baseline", "sequence": "fat", "plane": "axial", "organ": "liver"},
    "render_comparison": {"sequence": "water", "plane": "coronal", "organ": "liver"},
    "ask_patient": {"question": "What brings you in today?"},
    "order_exam": {"exam": "cbc"},
    "submit_diagnosis": {"diagnosis": "gout"},
    # every exam tool, with its required parameters at their first allowed value
    **{
        exam.name: {p: (exam.allowed(p) or ("unspecified",))[0] for p in exam.required}
        for exam in EXAMS.values()
    },
}


class Client:
    """Tool calls that remember what the client saw, to compare with the audit log."""

    def __init__(self, url: str):
        self.url = url
        self.seen: Counter = Counter()

    async def call(
        self,
        http: httpx.AsyncClient,
        tool: str,
        episode: str,
        patient: str,
        headers=GOOD,
        arguments: dict | None = None,
    ) -> httpx.Response:
        body = {
            "episode_id": episode,
            "patient_id": patient,
            "arguments": ARGUMENTS.get(tool, {}) if arguments is None else arguments,
        }
        response = await http.post(f"{self.url}/v1/tools/{tool}", json=body, headers=headers)
        self.seen[(tool, response.status_code)] += 1
        return response


def test_scope_and_auth(dataset, tmp_path, figures):
    assert set(ARGUMENTS) == set(registry.all_tools())
    store = PatientStore(dataset)
    patients = store.patient_ids()
    dates = {p: store.patient(p).visits[0].acq_date.isoformat() for p in patients}
    audit = tmp_path / "audit.jsonl"
    cases = make_cases(10, seed=4)  # the clinic environment on the same server: its cases are patients too
    write_csv(cases, tmp_path / "clinic" / "clinic_synthetic.csv")
    opening = ARGUMENTS["ask_patient"]["question"]
    complaints = {c.case_id: RulePatient(c, NoisePlan()).answer(opening, []) for c in cases}
    env = {
        "CASE_ENV_DATA_ROOT": str(dataset),
        "CASE_ENV_TOKEN": TOKEN,
        "CASE_ENV_AUDIT_LOG": str(audit),
        "CASE_ENV_WORKERS": "2",
        "CASE_ENV_CACHE_DIR": str(tmp_path / "cache"),
        "CASE_ENV_EPISODE_DB": str(tmp_path / "episodes.sqlite"),
        "CASE_ENV_CLINIC_CASES": str(tmp_path / "clinic"),
    }
    serve = [sys.executable, "-m", "case_env.cli", "serve", "--log-level", "info", "--access-log"]
    with ServerProcess(tmp_path / "server.log", env, command=serve) as server:
        routes = _routes(server.url)
        client = Client(server.url)
        auth_refusals, auth_leaks = asyncio.run(_auth(client, routes))
        scope = asyncio.run(_scope(client, patients, dates, rounds=size(ci=3, full=20)))
        clinic = asyncio.run(
            _scope(client, list(complaints), complaints, rounds=size(ci=1, full=5), first="ask_patient")
        )
        race = asyncio.run(_race(client, patients, episodes=size(ci=10, full=100)))
        refusals = asyncio.run(_refusals(client))
    log = (tmp_path / "server.log").read_text(errors="replace")
    audit_text = audit.read_text()
    lines = [json.loads(line) for line in audit_text.splitlines()]
    audited = Counter((line["tool"], line["http_status"]) for line in lines)
    secrets_in_logs = sum(text.count(secret) for text in (log, audit_text) for secret in [TOKEN, WRONG[0]])
    figures.update(
        {
            "routes_requiring_token": len(routes),
            "unauthenticated_attempts_refused": auth_refusals,
            "unauthenticated_attempts_answered": auth_leaks,
            "scope_attempts": scope["attempts"] + clinic["attempts"],
            "scope_attempts_refused": scope["refused"] + clinic["refused"],
            "other_patient_data_returned": scope["leaks"] + clinic["leaks"],
            "clinic_scope_attempts": clinic["attempts"],
            "racing_episodes": race["episodes"],
            "racing_episodes_with_one_patient": race["single"],
            "tokens_in_logs": secrets_in_logs,
            "patient_ids_in_server_log": sum(log.count(p) for p in [*patients, *complaints]),
            "refused_kinds_audited": refusals,
            "tool_calls_made": sum(client.seen.values()),
            "audit_lines": len(lines),
            "audit_matches_calls": audited == client.seen,
        }
    )
    assert auth_leaks == 0 and auth_refusals == len(routes) * (len(WRONG) + 2)
    assert (
        figures["scope_attempts_refused"] == figures["scope_attempts"]
        and figures["other_patient_data_returned"] == 0
    )
    assert clinic["attempts"] == len(cases) * len(ARGUMENTS) * size(ci=1, full=5)
    assert race["single"] == race["episodes"]
    assert secrets_in_logs == 0 and figures["patient_ids_in_server_log"] == 0
    assert "GET /v1/tools" in log  # the access log was on, so the checks above read a real log
    assert audited == client.seen, (audited - client.seen, client.seen - audited)


def _routes(url: str) -> list[tuple[str, str]]:
    """Every operation that declares the bearer scheme, read from the server's own OpenAPI document."""
    bearer = {"Authorization": f"Bearer {TOKEN}"}  # the document is behind the token too
    spec = httpx.get(f"{url}/openapi.json", headers=bearer, timeout=10).json()
    routes = [
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if op.get("security")
    ]
    # one path per tool (case_env/server/contract.py)
    assert {path for _, path in routes} >= {"/metrics", "/v1/tools", "/v1/tools/list_visits", "/v1/score"}
    assert all(path.startswith("/v1/") or path in ("/metrics", "/readyz") for _, path in routes)
    assert {p for p in spec["paths"] if p.startswith("/v1/")} <= {p for _, p in routes}
    return routes


async def _auth(client: Client, routes: list[tuple[str, str]]) -> tuple[int, int]:
    score = {"data_source": "x", "solution_str": "<answer>A</answer>", "ground_truth": "A"}
    call = {"episode_id": "auth-probe", "patient_id": "case0001", "arguments": {}}
    attempts = [{}, {"Authorization": TOKEN}] + [{"Authorization": f"Bearer {w}"} for w in WRONG]
    refused = answered = 0
    async with httpx.AsyncClient(timeout=30) as http:
        for method, path in routes:
            target = client.url + path.replace("{episode_id}", "auth-probe")
            tool = path.removeprefix("/v1/tools/") if path.startswith("/v1/tools/") else None
            body = call if tool else score if path == "/v1/score" else None
            for headers in attempts:
                response = await http.request(method, target, json=body, headers=headers)
                if tool:
                    client.seen[(tool, response.status_code)] += 1
                if response.status_code == 401 and response.headers.get("www-authenticate") == "Bearer":
                    refused += 1
                else:
                    answered += 1
            allowed = await http.request(method, target, json=body, headers=GOOD)
            if tool:
                client.seen[(tool, allowed.status_code)] += 1
            assert allowed.status_code in (200, 404), (
                path,
                allowed.text,
            )  # 404: the probe episode is unknown
    return refused, answered


async def _scope(
    client: Client, patients: list[str], marks: dict[str, str], rounds: int, first: str = "list_visits"
) -> dict:
    """Each episode, bound to its owner by a `first` call, tries every tool on another patient; `marks` holds
    text only that patient's answers contain (a visit date, a chief complaint)."""
    attempts = refused = leaks = 0
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=4)) as http:
        for r in range(rounds):
            for i, owner in enumerate(patients):
                episode = f"scope-{first}-{r}-{i}"
                bound = await client.call(http, first, episode, owner)
                assert bound.status_code == 200 and marks[owner] in bound.json()["text"]
                other = patients[(i + 1 + r % (len(patients) - 1)) % len(patients)]  # never the owner
                assert other != owner
                for tool in ARGUMENTS:
                    response = await client.call(http, tool, episode, other)
                    attempts += 1
                    refused += (
                        response.status_code == 403 and response.json()["error"]["code"] == "scope_violation"
                    )
                    leaks += marks[other] in response.text or bool(response.json().get("images"))
                # the owner still gets answers, and only its own (a patient asked again answers from the
                # conversation so far, which the server keeps: not the opening complaint word for word)
                own = await client.call(http, first, episode, owner)
                assert own.status_code == 200 and own.json()["ok"] and marks[other] not in own.json()["text"]
    return {"attempts": attempts, "refused": refused, "leaks": leaks}


async def _refusals(client: Client) -> list[int]:
    """One call of each other kind of refusal, so the audit comparison covers them too."""
    async with httpx.AsyncClient(timeout=30) as http:
        statuses = [
            (await client.call(http, "list_visits", "refusal", "case9999")).status_code,
            (await client.call(http, "list_visits", "../refusal", "case0001")).status_code,
            (
                await client.call(
                    http, "get_organ_volume", "refusal", "case0001", arguments={"organ": "x" * 70_000}
                )
            ).status_code,
            (await client.call(http, "no_such_tool", "refusal", "case0001")).status_code,
            (await client.call(http, "list_visits", "refusal", "case0001", headers={})).status_code,
        ]
    assert statuses == [404, 422, 413, 200, 401]
    return sorted(set(statuses))


async def _race(client: Client, patients: list[str], episodes: int) -> dict:
    """Many first calls of one fresh episode at once, each naming a different patient, spread over both
    workers by fresh connections: exactly one patient may own the episode and only its calls succeed."""
    single = 0
    for n in range(episodes):
        episode = f"race-{n}"

        async def one(patient: str, episode: str):
            async with httpx.AsyncClient(timeout=60) as http:  # own connection: lands on either worker
                return patient, await client.call(http, "list_visits", episode, patient)

        results = await asyncio.gather(*[one(p, episode) for p in patients])
        winners = {p for p, r in results if r.status_code == 200}
        losers = [r.status_code for p, r in results if p not in winners]
        async with httpx.AsyncClient(timeout=30) as http:
            owner = (await http.get(f"{client.url}/v1/episodes/{episode}", headers=GOOD)).json()["patient_id"]
        single += winners == {owner} and losers == [403] * (len(patients) - 1)
    return {"episodes": episodes, "single": single}
