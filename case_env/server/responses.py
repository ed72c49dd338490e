"""Answers of pure tool calls, remembered: the same call on the same data gets the same bytes.

Tools are pure functions of (case data, arguments), and GRPO rolls each prompt out several times at once
(verl's `rollout.n`), so the trajectories of a group make the same calls. Each
answer is kept with its encoded images (base64 done once) under (tool, case, canonical arguments, the
case's file fingerprint); a replaced file changes the fingerprint, so stale answers are never served.
Only successful answers are kept, in the same byte-bounded LRU that holds decoded volumes; identical calls
that arrive while the first is computed wait for its answer instead of computing it again. `inflight`
belongs to the event loop of one worker and is only touched from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

from case_env.core.cache import ByteLRU


class ResponseCache(ByteLRU[Any]):
    def __init__(self, max_bytes: int):
        super().__init__(max_bytes)
        self.inflight: dict[
            Hashable, asyncio.Future
        ] = {}  # calls being computed, for identical ones to await
