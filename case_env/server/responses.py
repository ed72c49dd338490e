"""Answers of pure tool calls, remembered: the same call on the same data gets the same bytes.

Tools are pure functions of (patient data, arguments), and GRPO rolls each prompt out several times at once
(verl's `rollout.n`), so the trajectories of a group ask for the same visits, volumes and slices. Each
answer is kept with its encoded images (base64 done once) under (tool, patient, canonical arguments, the
patient's file fingerprint); a replaced file changes the fingerprint, so stale answers are never served.
Only successful answers are kept, within a byte budget, least recently used first out; identical calls that
arrive while the first is computed wait for its answer instead of computing it again. The cache belongs to
the event loop of one worker and is only touched from it, so it needs no lock.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class ResponseCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.inflight: dict[
            Hashable, asyncio.Future
        ] = {}  # calls being computed, for identical ones to await

    def get(self, key: Hashable) -> Any | None:
        found = self._items.get(key)
        if found is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return found[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        if size > self.max_bytes or key in self._items:
            return
        while self._items and self._bytes + size > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self._bytes -= old
        self._items[key] = (value, size)
        self._bytes += size

    @property
    def bytes(self) -> int:
        return self._bytes
