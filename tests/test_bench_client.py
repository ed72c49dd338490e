"""The load generator's HTTP/1.1 client against a real TCP server that answers with scripted bytes: framing
(Content-Length, chunked, split at every byte), keep-alive and reconnection, and the failures it must name."""

from __future__ import annotations

import asyncio
import json

import pytest

from case_env.bench.client import Client, ProtocolError


class Scripted:
    """A loopback server that answers each request with the next scripted reply (bytes written one write
    per item, so a reply can arrive in pieces; a last empty item closes the connection), recording requests
    and connections."""

    def __init__(self, replies: list[list[bytes] | None]):
        self.replies = replies
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                self.requests.append((head, await reader.readexactly(length)))
                reply = self.replies.pop(0)
                if reply is None:  # never answer: wait for the client to give up and close
                    await reader.read()
                    break
                for piece in reply:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
                if b"connection: close" in b"".join(reply).lower() or reply[-1] == b"":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def exchange(replies: list[list[bytes] | None], calls: int, timeout_s: float = 5.0):
    """Make `calls` requests through one Client; (answers or exceptions, the server's record)."""
    server = Scripted(replies)

    async def run():
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        client = Client(f"http://127.0.0.1:{port}", timeout_s=timeout_s)
        out = []
        for n in range(calls):
            try:
                out.append(await client.post_json(f"/v1/tools/t{n}", {"n": n, "text": "é"}))
            except (OSError, TimeoutError, ProtocolError) as exc:
                out.append(exc)
        client.close()
        listener.close()
        await listener.wait_closed()
        return out

    return asyncio.run(run()), server


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_keep_alive_requests_share_one_connection_and_carry_json():
    answers, server = exchange([[ok(b'{"ok":true}')], [ok(b"second")]], 2)
    assert answers == [(200, b'{"ok":true}'), (200, b"second")]
    assert server.connections == 1
    head, body = server.requests[0]
    assert head.startswith(b"POST /v1/tools/t0 HTTP/1.1\r\n") and b"Content-Type: application/json" in head
    assert json.loads(body) == {"n": 0, "text": "é"} and b"Host: 127.0.0.1:" in head


def test_replies_split_at_every_byte_are_framed():
    chunked = (
        b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    plain = ok(b"0123456789")
    answers, _ = exchange([[bytes([b]) for b in chunked], [bytes([b]) for b in plain]], 2)
    assert answers == [(503, b"hello world"), (200, b"0123456789")]


def test_a_closed_connection_is_opened_again():
    answers, server = exchange(
        [
            [ok(b"a", b"Connection: close\r\n")],
            [b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb"],
            [ok(b"c")],
        ],
        3,
    )
    assert answers == [(200, b"a"), (200, b"b"), (200, b"c")]
    assert server.connections == 3  # HTTP/1.0 without keep-alive closes too


@pytest.mark.parametrize(
    ("reply", "kind", "words"),
    [
        ([b"SMTP ready\r\n\r\n"], ProtocolError, "status line"),
        ([b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\nbody"], ProtocolError, "neither Content-Length"),
        ([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", b""], ConnectionError, "closed"),
        (None, TimeoutError, "timeout"),
    ],
)
def test_failures_are_named_and_the_next_call_reconnects(reply, kind, words):
    answers, server = exchange([reply, [ok(b"fine")]], 2, timeout_s=0.5)
    assert isinstance(answers[0], kind) and words in str(answers[0])
    assert answers[1] == (200, b"fine") and server.connections == 2


def test_only_plain_http_urls():
    with pytest.raises(ValueError, match="plain http"):
        Client("https://example.org")


def test_turns_merge_into_one_result():
    """Calls, time and errors of the turns add up; the load generator's CPU is weighted by calls; each
    percentile is the median of the turns'."""
    from case_env.bench.measure import merged_turns

    def turn(calls: int, seconds: float, p99: float, cpu: float, errors: dict) -> dict:
        figures = {"n": calls, "p50": p99 / 4, "p95": p99 / 2, "p99": p99, "mean": p99 / 3}
        return {
            "calls": calls,
            "duration_s": seconds,
            "errors": errors,
            "latency_ms": {"list_visits": figures},
            "latency_ms_all": figures,
            "load_cpu_ms_per_call": cpu,
        }

    merged = merged_turns(
        [
            turn(100, 1.0, 30.0, 0.1, {}),
            turn(300, 2.0, 10.0, 0.2, {"http_429": 2}),
            turn(200, 1.0, 20.0, 0.3, {"http_429": 1}),
        ],
        rollouts=8,
    )
    assert merged["calls"] == 600 and merged["duration_s"] == 4.0 and merged["calls_per_s"] == 150.0
    assert merged["errors"] == {"http_429": 3}
    assert (
        merged["latency_ms"]["list_visits"]["p99"] == 20.0 and merged["latency_ms"]["list_visits"]["n"] == 600
    )
    assert merged["load_cpu_ms_per_call"] == round((10 + 60 + 60) / 600, 3)
