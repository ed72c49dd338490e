"""Ground-truth randomness that never changes with numpy.

numpy only promises a `Generator` stream on the same build and machine, so every ground-truth parameter
(a scenario, a size, a condition, a noise plan) is drawn by hashing a name with the
seed instead. A draw depends only on (seed, scope, name): adding a new parameter later does not shift
any existing one, which a shared sequential stream would. `Generator` is kept for noise and texture.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class FrozenDraw:
    """Named, order-independent draws for one scope (e.g. one case)."""

    def __init__(self, seed: int, scope: str = ""):
        self.seed = seed
        self.scope = scope

    def child(self, scope: str) -> FrozenDraw:
        return FrozenDraw(self.seed, f"{self.scope}/{scope}")

    def unit(self, name: str) -> float:
        """Uniform in [0, 1) from 53 bits of blake2b."""
        digest = hashlib.blake2b(f"{self.seed}|{self.scope}|{name}".encode(), digest_size=8).digest()
        return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)

    def uniform(self, name: str, low: float, high: float) -> float:
        return low + (high - low) * self.unit(name)

    def normal(self, name: str, mean: float = 0.0, sd: float = 1.0) -> float:
        u1 = max(self.unit(name + "#1"), 1e-300)
        u2 = self.unit(name + "#2")
        return mean + sd * math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)

    def integer(self, name: str, low: int, high: int) -> int:
        """Uniform integer in [low, high]."""
        return low + min(int(self.unit(name) * (high - low + 1)), high - low)

    def choice(self, name: str, options: Sequence[T]) -> T:
        return options[self.integer(name, 0, len(options) - 1)]

    def chance(self, name: str, p: float) -> bool:
        return self.unit(name) < p

    def shuffled(self, name: str, items: Sequence[T]) -> list[T]:
        return sorted(items, key=lambda item: self.unit(f"{name}:{item}"))
