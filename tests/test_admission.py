"""Admission: slots, the bounded queue, expiry, fairness, and a client that leaves while waiting."""

from __future__ import annotations

import asyncio

from case_env.server.admission import Admission


def test_slots_queue_and_refusal():
    async def run():
        gate = Admission(limit=2, max_queued=2, wait_s=5.0)
        assert await gate.enter() and await gate.enter()
        waiting = [asyncio.create_task(gate.enter()) for _ in range(2)]
        await asyncio.sleep(0)
        assert gate.queued == 2
        assert not await gate.enter()  # queue full: refused at once
        gate.leave()
        assert await waiting[0] and not waiting[1].done()  # the oldest waiter got the freed slot
        gate.leave()
        assert await waiting[1]
        gate.leave()
        gate.leave()
        return gate.active, gate.queued

    assert asyncio.run(run()) == (0, 0)


def test_a_waiter_gives_up_after_wait_s():
    async def run():
        gate = Admission(limit=1, max_queued=4, wait_s=0.05)
        assert await gate.enter()
        assert not await gate.enter()  # waited 50 ms, no slot came
        gate.leave()
        return gate.active, gate.queued

    assert asyncio.run(run()) == (0, 0)


def test_a_cancelled_waiter_never_holds_a_slot():
    async def run():
        gate = Admission(limit=1, max_queued=4, wait_s=5.0)
        assert await gate.enter()
        leaving = asyncio.create_task(gate.enter())
        staying = asyncio.create_task(gate.enter())
        await asyncio.sleep(0)
        leaving.cancel()  # the client disconnected while queued
        await asyncio.sleep(0)
        gate.leave()
        assert await staying  # the slot skipped the cancelled waiter
        gate.leave()
        # a slot granted in the same instant as the cancellation is passed on, not lost
        assert await gate.enter()
        late = asyncio.create_task(gate.enter())
        await asyncio.sleep(0)
        gate.leave()  # grants `late` ...
        late.cancel()  # ... which is cancelled before it runs
        await asyncio.gather(late, return_exceptions=True)
        return gate.active, gate.queued

    assert asyncio.run(run()) == (0, 0)


def test_zero_queue_refuses_at_once():
    async def run():
        gate = Admission(limit=1, max_queued=0, wait_s=5.0)
        assert await gate.enter()
        return await gate.enter()

    assert asyncio.run(run()) is False
