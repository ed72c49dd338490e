"""case-env's HTTP protocol (`case_env.server.connections`: uvicorn's httptools with deadlines and a
bounded head) sends the very bytes stock uvicorn sends. Both protocols serve the same raw ASGI app under
real uvicorn on loopback, and raw sockets send them the same requests: keep-alive, pipelined, streamed,
HEAD, 204, `Connection: close`, `Expect: 100-continue` and an 8 MB body read slowly. (The deadlines and the
bound are the reliability suite's: test_slow_clients, test_outside_audit.)"""

from __future__ import annotations

import asyncio
import re
import socket
import time

import pytest

from case_env.server.connections import BoundedHttpToolsProtocol
from tests.server_harness import serve_app

BIG = bytes(range(256)) * 32768  # 8 MB: more than the socket and uvicorn's buffers hold


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    path = scope["path"]
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if path == "/stream":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        for part in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
        return
    status, payload, headers = (
        200,
        b'{"ok":true,"echo":"' + body + b'"}',
        [(b"content-type", b"application/json")],
    )
    if path == "/empty":
        status, payload, headers = 204, b"", []
    elif path == "/close":
        headers.append((b"connection", b"close"))
    elif path == "/big":
        payload = BIG
    headers.append((b"content-length", str(len(payload)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _exchange(url: str, requests: list[bytes], pause_s: float = 0.0, expect: bytes | None = None) -> bytes:
    """Send raw requests on one connection and read until the server goes quiet or closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        for request in requests:
            if expect is not None:
                head, body = request.split(b"\r\n\r\n", 1)
                conn.sendall(head + b"\r\n\r\n")
                interim = conn.recv(1024)
                assert interim == expect, interim
                conn.sendall(body)
            else:
                conn.sendall(request)
        conn.settimeout(0.5)
        received = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
            if pause_s:
                time.sleep(pause_s)  # a slow reader: the server's writes back up
    return re.sub(rb"date: [^\r]*\r\n", b"date: -\r\n", received)


def _get(path: str, extra: bytes = b"", method: bytes = b"GET") -> bytes:
    return method + b" " + path.encode() + b" HTTP/1.1\r\nhost: test\r\n" + extra + b"\r\n"


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST "
        + path.encode()
        + b" HTTP/1.1\r\nhost: test\r\ncontent-length: %d\r\n" % len(body)
        + extra
        + b"\r\n"
        + body
    )


CASES = {
    "keep-alive": ([_post("/a", b"1"), _post("/a", b"2"), _get("/a")], {}),
    "pipelined": ([_post("/a", b"1") + _post("/a", b"2") + _get("/empty")], {}),
    "streamed": ([_get("/stream"), _get("/a")], {}),
    "head and 204": ([_get("/a", method=b"HEAD"), _get("/empty")], {}),
    "connection close": ([_get("/close")], {}),
    "expect 100-continue": (
        [_post("/a", b"body", b"expect: 100-continue\r\n")],
        {"expect": b"HTTP/1.1 100 Continue\r\n\r\n"},
    ),
    "8 MB read slowly": ([_get("/big")], {"pause_s": 0.002}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_bytes_as_stock_uvicorn(case):
    requests, options = CASES[case]
    with serve_app(app, http="httptools") as stock:
        expected = _exchange(stock.url, requests, **options)
    with serve_app(app, http=BoundedHttpToolsProtocol) as ours:
        got = _exchange(ours.url, requests, **options)
    assert got == expected and expected.startswith(b"HTTP/1.1 ")
    if case == "8 MB read slowly":
        assert expected.endswith(BIG)
