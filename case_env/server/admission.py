"""Admission of tool calls: at most `limit` in flight per worker, a bounded queue in front of them.

A GRPO step starts hundreds of trajectories at once, so calls arrive in bursts far above what the server
can run at the same moment. Answering 429 at once to everything above the bound turns each burst into a
thundering herd of retries that all come back together (measured in the reliability suite: a 2,000-call
burst took 105 s and 9,000 refusals to drain). A short queue absorbs the burst instead: a call waits up to
`wait_s` for a slot, and only a call that finds the queue full, or waits too long, gets 429.

Slots pass straight from a finishing call to the oldest waiter, so the order is fair. Everything runs on
the worker's event loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class Admission:
    def __init__(self, limit: int, max_queued: int, wait_s: float):
        self.limit = limit
        self.max_queued = max_queued
        self.wait_s = wait_s
        self.active = 0
        self._waiters: deque[asyncio.Future[bool]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def enter(self) -> bool:
        """True: the caller holds a slot and must `leave()`. False: refuse the call (429)."""
        if self.active < self.limit and not self._waiters:
            self.active += 1
            return True
        if len(self._waiters) >= self.max_queued or self.wait_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(granted)
        timer = loop.call_later(self.wait_s, self._expire, granted)
        try:
            return await granted
        except asyncio.CancelledError:  # the client went away while waiting
            if granted.done() and not granted.cancelled() and granted.result():
                self.leave()  # the slot arrived just before the cancellation: hand it on
            else:
                self._discard(granted)
            raise
        finally:
            timer.cancel()

    def leave(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)  # the slot moves to the waiter; `active` is unchanged
                return
        self.active -= 1

    def _expire(self, granted: asyncio.Future[bool]) -> None:
        if not granted.done():
            self._discard(granted)
            granted.set_result(False)

    def _discard(self, granted: asyncio.Future[bool]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(granted)
