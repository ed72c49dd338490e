"""The episode bindings table (`case_env.server.bindings`): a hash table in a shared file, checked against a
dictionary under colliding hashes, across forked workers, after a worker dies holding the lock, and across
restarts."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time

import pytest

from case_env.server import bindings as bindings_module
from case_env.server.bindings import Bindings
from case_env.server.episodes import EpisodeLog


def test_the_table_agrees_with_a_dictionary_under_colliding_hashes(monkeypatch):
    """Claims, touches, expiry and evictions against a plain model, with hashes that put every episode in
    one of five home slots near the end of the table, so runs are long and wrap around its end: a deletion
    that shifted the wrong entry back would leave one unreachable."""
    monkeypatch.setattr(bindings_module, "_hash", lambda episode, key: 59 + len(episode) % 5)
    rng = random.Random(7)
    table = Bindings(None, max_episodes=20)  # 64 slots
    model: dict[str, tuple[str, float]] = {}  # episode -> (patient, last seen)
    now = 0.0
    for step in range(3000):
        now += 1.0
        episode = f"e{rng.randrange(60)}" + "x" * rng.randrange(5)
        action = rng.random()
        if action < 0.7:
            patient = f"case{rng.randrange(3):04d}"
            bound, new = table.claim(episode, patient, now)
            if episode in model:
                assert (bound, new) == (model[episode][0], False)
                model[episode] = (bound, now)
            else:
                assert (bound, new) == (patient, True)
                if len(model) == 20:  # the cap: the least recently seen makes room
                    del model[min(model, key=lambda e: model[e][1])]
                model[episode] = (patient, now)
        elif action < 0.85:
            chosen = [*rng.sample(sorted(model), min(3, len(model))), "never-bound"]
            times = {e: now + i / 10 for i, e in enumerate(chosen)}  # no ties: the cap's order is defined
            assert table.touch(times) == set(chosen) - {"never-bound"}
            model.update({e: (model[e][0], times[e]) for e in chosen if e in model})
        else:
            cutoff = now - rng.randrange(5, 60)
            dropped = table.expire(cutoff)
            expected = {e for e, (_, seen) in model.items() if seen < cutoff}
            assert sorted(dropped) == sorted(expected)
            model = {e: v for e, v in model.items() if e not in expected}
        assert table.live == len(model)
        if step % 100 == 0:
            for e, (patient, seen) in model.items():
                assert table.lookup(e) is not None and table.lookup(e)[0::2] == (patient, seen)
    table.close()


def test_the_cap_evicts_the_least_recently_seen():
    table = Bindings(None, max_episodes=3)
    for n in range(3):
        table.claim(f"e{n}", "case0001", now=float(n))
    table.touch({"e0": 10.0})
    assert table.claim("e3", "case0002", now=11.0) == ("case0002", True)
    assert table.lookup("e1") is None and table.live == 3
    assert [table.lookup(e)[0] for e in ("e0", "e2", "e3")] == ["case0001", "case0001", "case0002"]
    assert table.expire(idle_before=5.0) == ["e2"] and table.live == 2
    table.close()


def _claim_all(path, episodes: list[str], patient: str, barrier) -> dict[str, str]:
    table = Bindings(path, max_episodes=1000)
    barrier.wait()  # every worker claims at the same moment
    bound = {e: table.claim(e, patient, time.time())[0] for e in episodes}
    table.close()
    return bound


def test_forked_workers_racing_for_the_same_episodes_agree(tmp_path):
    """Four workers claim the same 300 fresh episodes at once, each for its own patient: each episode
    gets exactly one patient, the same one in every worker's answer and in the table afterwards."""
    context = multiprocessing.get_context("fork")  # worker processes, as uvicorn's are
    path = tmp_path / "episodes.sqlite-bindings"
    episodes = [f"race-{n}" for n in range(300)]
    with multiprocessing.Manager() as manager, context.Pool(4) as pool:
        barrier = manager.Barrier(4)
        answers = pool.starmap(_claim_all, [(path, episodes, f"case{n:04d}", barrier) for n in range(4)])
    table = Bindings(path, max_episodes=1000)
    for episode in episodes:
        owner = table.lookup(episode)[0]
        assert [answer[episode] for answer in answers] == [owner] * 4
    assert table.live == 300
    table.close()


def test_a_worker_killed_while_holding_the_lock_blocks_no_one(tmp_path):
    path = tmp_path / "bindings"
    Bindings(path, max_episodes=10).close()
    child = os.fork()
    if child == 0:  # a worker that takes the lock and dies before letting go
        table = Bindings(path, max_episodes=10)
        table.__enter__()
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(child, 0)
    table = Bindings(path, max_episodes=10)
    assert table.claim("after", "case0001", 1.0) == ("case0001", True)
    table.close()


def test_bindings_survive_a_restart_and_a_foreign_file_is_laid_out_anew(tmp_path):
    path = tmp_path / "bindings"
    table = Bindings(path, max_episodes=10)
    table.claim("kept", "case0001", 5.0)
    table.close()
    table = Bindings(path, max_episodes=10)
    assert table.lookup("kept") == ("case0001", 5.0, 5.0) and table.live == 1
    table.close()
    bigger = Bindings(path, max_episodes=100)  # too small for the new cap: laid out anew, bindings lost
    assert bigger.capacity == 256 and bigger.lookup("kept") is None and bigger.live == 0
    bigger.close()
    path.write_bytes(b"not a bindings file" * 1000)
    table = Bindings(path, max_episodes=10)
    assert table.live == 0 and table.claim("fresh", "case0002", 1.0) == ("case0002", True)
    table.close()


def test_ids_longer_than_a_slot_holds_are_refused_not_cut():
    """Two long ids that share their first 128 characters must never share a binding."""
    table = Bindings(None, max_episodes=10)
    with pytest.raises(ValueError, match="episode id of 129 characters"):
        table.claim("e" * 129, "case0001", 1.0)
    with pytest.raises(ValueError, match="case id of 65 characters"):
        table.claim("e", "c" * 65, 1.0)
    assert table.live == 0
    table.close()


def test_a_worker_forgets_what_it_remembers_once_any_worker_drops_an_episode(tmp_path):
    """Worker A remembers e -> case0001. Worker B sweeps e away (idle) and binds e anew to case0002. A must
    not keep serving e as case0001 from memory: the table's count of dropped episodes moved."""
    path = tmp_path / "episodes.sqlite"
    a = EpisodeLog(path, idle_s=100.0, max_episodes=10, max_calls=4)
    b = EpisodeLog(path, idle_s=100.0, max_episodes=10, max_calls=4)
    assert a.bind("e", "case0001", now=1000.0) == "case0001"
    assert a.bind("e", "case0001", now=1001.0) == "case0001"  # remembered
    assert b.sweep(now=1200.0) == 1
    assert b.bind("e", "case0002", now=1201.0) == "case0002"
    assert a.bind("e", "case0001", now=1202.0) == "case0002"  # refused by the route: bound elsewhere
    assert a.get("e")["patient_id"] == "case0002"
    a.close()
    b.close()
