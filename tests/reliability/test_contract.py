"""Check 17 (issue 31): the token first, and no redirects. At 84b9f1d `POST /v1/tools/list_visits/` answered
an undocumented 307 before the token check, its `Location` built from the request's `Host` header
(`Host: evil.example` -> `http://evil.example/...`), and a malformed body got 422 before 401."""

from __future__ import annotations

import httpx
import pytest

from tests.server_harness import live_server

TOKEN = "contract-token-0123456789"
GOOD = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("contract"), token=TOKEN) as live:
        yield live


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/v1/tools/list_visits/", {"episode_id": "e", "patient_id": "case0001"}, {"Host": "evil.example"}),
        ("/v1/tools/list_visits", b"{not json", {"content-type": "application/json"}),
        ("/v1/score", {"data_source": 5}, {}),
        ("/v1/tools/list_visits", b"x" * 200_000, {"content-type": "application/json"}),
        ("/v1/nowhere", None, {}),
    ],
)
def test_without_the_token_every_guarded_request_gets_401_and_nothing_else(server, path, body, headers):
    data = {"content": body} if isinstance(body, bytes) else {"json": body}
    reply = httpx.post(f"{server.url}{path}", headers=headers, follow_redirects=False, **data)
    assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer"
    assert "location" not in reply.headers and reply.json()["error"]["code"] == "unauthorized"


def test_with_the_token_a_trailing_slash_is_not_found_not_redirected(server):
    body = {"episode_id": "e", "patient_id": "case0001", "arguments": {}}
    slash = httpx.post(
        f"{server.url}/v1/tools/list_visits/", json=body, headers={**GOOD, "Host": "evil.example"}
    )
    assert slash.status_code == 404 and "location" not in slash.headers
    malformed = httpx.post(
        f"{server.url}/v1/tools/list_visits",
        content=b"{not json",
        headers={**GOOD, "content-type": "application/json"},
    )
    assert malformed.status_code == 422
    unknown = httpx.get(f"{server.url}/v1/tools", params={"env": "mars"}, headers=GOOD)
    assert unknown.status_code == 422 and "unknown environment 'mars'" in unknown.json()["error"]["message"]
    misspelt = httpx.get(f"{server.url}/v1/tools", params={"evn": "imaging"}, headers=GOOD)
    assert misspelt.status_code == 422 and "unknown query parameter 'evn'" in misspelt.text
