"""The episode store's one interface, held by both implementations: SQLite (a file shared by forked workers)
and Redis (a real redis-server). Each check runs on both."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

import pytest

from case_env.bench.process import RedisServer
from case_env.core.calls import Call
from case_env.server.store import Binding, StoreUnavailableError, open_store


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["sqlite", "redis"])
def make(request, tmp_path):
    """A function making a store (the same one each time it is called: a second worker's connection)."""
    if request.param == "redis":
        server = request.getfixturevalue("redis")
        server.flush()
        return lambda **kw: open_store(server.url, None, **_limits(kw))
    path = tmp_path / "episodes.sqlite"
    return lambda **kw: open_store(None, path, **_limits(kw))


def _limits(kw: dict) -> dict:
    return {"idle_s": 100.0, "max_episodes": 1000, "max_calls": 4, **kw}


def call(n: int, tool: str = "list_visits", status: str = "ok") -> Call:
    return Call(tool=tool, arguments={"n": n}, status=status, http_status=200, latency_ms=1.0)


def run(coroutine):
    return asyncio.run(coroutine)


def test_the_first_writer_wins_and_everyone_agrees(make):
    async def race() -> set:
        stores = [make() for _ in range(4)]  # four workers' connections
        bound = await asyncio.gather(
            *(s.bind("shared", Binding(f"case{n:04d}", "imaging"), 1000.0) for n, s in enumerate(stores * 8))
        )
        for s in stores:
            await s.close()
        return {b.case_id for b, _ in bound}


def _bind_in_a_worker(path: Path, barrier, n: int) -> str:
    barrier.wait()  # every worker opens the new file at the same moment, as uvicorn starts them

    async def bind() -> str:
        store = open_store(None, path, 100.0, 10, 4)
        bound = await store.bind("shared", Binding(f"case{n:04d}", "imaging"), 1000.0)
        await store.close()
        return bound.case_id

    return asyncio.run(bind())


def test_forked_workers_starting_together_share_one_sqlite_file(tmp_path):
    context = multiprocessing.get_context("fork")  # worker processes, like uvicorn's; threads never collide
    for attempt in range(3):
        path = tmp_path / f"episodes-{attempt}.sqlite"
        with multiprocessing.Manager() as manager, context.Pool(6) as pool:
            barrier = manager.Barrier(6)
            bound = pool.starmap(_bind_in_a_worker, [(path, barrier, n) for n in range(6)])
        assert len(set(bound)) == 1  # first writer wins, every worker agrees


def test_calls_are_logged_in_order_capped_and_counted(make):
    async def play():
        store = make(max_calls=4)
        binding = Binding("case0001", "clinic", '{"noise":{}}')
        assert await store.bind("e1", binding, 1000.0) == binding
        for n in range(10):
            assert await store.append("e1", binding, call(n), 1001.0 + n) == binding
        again = await store.bind("e1", Binding("case0002", "clinic"), 1020.0)
        _, calls = await store.lookup("e1", with_calls=True)
        got = await store.get("e1")
        await store.close()
        return again, calls, got

    again, calls, got = run(play())
    assert again == Binding("case0001", "clinic", '{"noise":{}}')  # the first call's binding, settings too
    assert [c.arguments["n"] for c in calls] == [6, 7, 8, 9]
    assert got.calls_total == 10 and [c.seq for c in got.calls] == [7, 8, 9, 10]
    assert [c.arguments["n"] for c in got.calls] == [6, 7, 8, 9] and got.calls[-1].time == 1010.0
    assert (got.created, got.last_seen) == (1000.0, 1010.0)


def test_a_call_of_another_case_or_an_ended_episode_is_not_logged(make):
    async def play():
        store = make()
        bound = await store.bind("e1", Binding("case0001", "imaging", row="test-00001"), 1000.0)
        other_case = await store.append("e1", Binding("case0002", "imaging"), call(0), 1001.0)
        first = await store.end("e1", {"score": 0.0, "pred": "A"}, 1002.0)
        second = await store.end("e1", {"score": 1.0, "pred": "B"}, 1003.0)
        after_end = await store.append("e1", bound, call(1), 1004.0)
        rebound = await store.bind("e1", Binding("case0001", "imaging", row="test-00001"), 1005.0)
        kept = await store.get("e1")
        never = await store.end("nobody", {"score": 1.0}, 1006.0)
        await store.close()
        return bound, other_case, first, second, after_end, rebound, kept, never

    bound, other_case, first, second, after_end, rebound, kept, never = run(play())
    assert other_case == bound and after_end.ended  # nothing recorded for another case or after the end
    assert first == second == {"score": 0.0, "pred": "A"}  # an episode ends once, with its first reward
    assert rebound.ended and kept.binding.ended and kept.reward == first and kept.calls_total == 0
    assert never is None


def test_past_the_cap_the_least_recently_used_go_ended_ones_first(make):
    async def play():
        store = make(max_episodes=3)
        for n in range(3):
            await store.bind(f"e{n}", Binding("case0001", "imaging"), 1000.0 + n)
        await store.append("e0", Binding("case0001", "imaging"), call(0), 1010.0)  # e1 the least recent now
        await store.end("e2", {"score": 1.0}, 1011.0)  # e2 ended: it goes before any live one
        await store.bind("e3", Binding("case0001", "imaging"), 1012.0)
        after_one = [(await store.lookup(f"e{n}"))[0] is not None for n in range(4)]
        await store.bind("e4", Binding("case0001", "imaging"), 1013.0)
        after_two = [(await store.lookup(f"e{n}"))[0] is not None for n in range(5)]
        live = await store.live(1013.0)
        await store.close()
        return after_one, after_two, live

    after_one, after_two, live = run(play())
    assert after_one == [True, True, False, True]  # the ended e2 went, not the older live e1
    assert after_two == [True, False, False, True, True]  # then the least recently used live one
    assert live == 3


def test_idle_episodes_expire(make, request):
    async def play():
        store = make(idle_s=0.5)
        now = __import__("time").time()
        await store.bind("brief", Binding("case0001", "imaging"), now)
        await store.bind("busy", Binding("case0001", "imaging"), now)
        await asyncio.sleep(0.4)
        await store.append("busy", Binding("case0001", "imaging"), call(0), now + 0.4)
        await asyncio.sleep(0.4)
        await store.sweep(now + 0.8)  # SQLite's sweep; Redis expires keys by itself
        kept = ((await store.lookup("brief"))[0], (await store.lookup("busy"))[0])
        await store.close()
        return kept

    brief, busy = run(play())
    assert brief is None and busy is not None


def test_an_unreachable_redis_is_named_and_binds_nothing(tmp_path):
    with RedisServer(tmp_path / "redis") as server:
        store = open_store(server.url, None, 100.0, 10, 4)
        server.kill()

        async def try_to_bind():
            try:
                with pytest.raises(StoreUnavailableError, match="Redis"):
                    await store.bind("e1", Binding("case0001", "imaging"), 1000.0)
                with pytest.raises(StoreUnavailableError):
                    await store.append("e1", Binding("case0001", "imaging"), call(0), 1000.0)
                with pytest.raises(StoreUnavailableError):
                    await store.ping()
            finally:
                await store.close()

        run(try_to_bind())


def test_episodes_outlive_a_restart(make, request, tmp_path):
    async def write():
        store = make()
        binding = Binding("case0001", "casereason", '{"attempts":3}')
        await store.bind("kept", binding, 1000.0)
        await store.append("kept", binding, call(0, "submit_diagnosis"), 1001.0)
        await store.close()

    async def read():
        store = make()
        found = await store.get("kept")
        await store.close()
        return found

    run(write())
    if "redis" in request.node.name:  # Redis itself restarts, from its append-only file
        server = request.getfixturevalue("redis")
        server.stop()
        server.start()
    found = run(read())
    assert found.binding == Binding("case0001", "casereason", '{"attempts":3}')
    assert [c.tool for c in found.calls] == ["submit_diagnosis"] and found.calls_total == 1


def test_a_binding_a_worker_remembers_never_outlives_its_episode(make):
    """A worker answers a known episode's lookup from memory; the store's own check at the append decides:
    an episode another worker ended takes no more calls, and one that expired meanwhile is bound anew."""

    async def play():
        a, b = make(idle_s=0.4), make(idle_s=0.4)
        binding = Binding("case0001", "imaging")
        await a.bind("ended", binding, 1000.0)
        await b.end("ended", {"score": 1.0}, 1000.1)
        remembered, _ = await a.lookup("ended", wanted=binding)
        refused = await a.append("ended", binding, call(0), 1000.2)
        asked, _ = await a.lookup("ended", wanted=binding)
        now = __import__("time").time()
        await a.bind("brief", binding, now)
        await asyncio.sleep(0.6)
        await b.sweep(now + 0.6)  # SQLite's sweep; Redis expires it by itself
        again = await a.append("brief", binding, call(1), now + 0.6)
        found = await b.get("brief")
        for store in (a, b):
            await store.close()
        return remembered, refused, asked, again, found

    remembered, refused, asked, again, found = run(play())
    assert not remembered.ended and refused.ended and asked.ended
    assert again == Binding("case0001", "imaging") and found.calls_total == 1
    assert [c.arguments["n"] for c in found.calls] == [1]
