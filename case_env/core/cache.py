"""A byte-bounded LRU, safe for many threads, loading each key once: decoded volumes, cached responses; and a
count-bounded one for small facts derived from the data, each cheap to compute again.

Decoding a `.nii.gz` costs 30-300 ms; a slice of a decoded array costs under a millisecond, so decoded arrays
are kept. Keys include the file's mtime and size, so a file replaced on disk
is decoded afresh and the stale entry ages out. When many requests want the same volume at once, one of
them decodes it and the rest wait for that result ("single flight"); a failed load is not cached, so the
next request retries.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


V = TypeVar("V", bound=Sized)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    loads: int = 0
    evictions: int = 0
    bytes: int = 0
    items: int = 0
    max_bytes: int = 0


class ByteLRU(Generic[V]):
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._pending: dict[Hashable, Future[V]] = {}
        self._stats = CacheStats(max_bytes=max_bytes)

    def get(self, key: Hashable, load: Callable[[], V]) -> V:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self._stats.hits += 1
                return self._items[key]
            self._stats.misses += 1
            pending = self._pending.get(key)
            owner = pending is None
            if owner:
                pending = Future()
                self._pending[key] = pending
        assert pending is not None
        if not owner:
            return pending.result()
        try:
            value = load()
        except BaseException as exc:
            with self._lock:
                del self._pending[key]
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._pending[key]
            self._stats.loads += 1
            self._insert(key, value)
        pending.set_result(value)
        return value

    def peek(self, key: Hashable) -> V | None:
        """The value if held (counted as a hit or a miss); never loads, so an event loop may call it."""
        with self._lock:
            if key not in self._items:
                self._stats.misses += 1
                return None
            self._items.move_to_end(key)
            self._stats.hits += 1
            return self._items[key]

    def put(self, key: Hashable, value: V) -> None:
        """Keep a value computed elsewhere, under the same budget as loaded ones."""
        with self._lock:
            if key not in self._items:
                self._insert(key, value)

    def _insert(self, key: Hashable, value: V) -> None:
        size = value.nbytes
        if size > self.max_bytes:
            return  # larger than the whole budget: serve it, keep nothing else out for it
        while self._items and self._bytes + size > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes
            self._stats.evictions += 1
        self._items[key] = value
        self._bytes += size

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(**{**self._stats.__dict__, "bytes": self._bytes, "items": len(self._items)})


class Memo:
    """A small thread-safe LRU of at most `size` derived facts, each cheap to compute again (no single flight:
    two threads that miss together both compute, and the facts are the same)."""

    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict[Hashable, object] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Hashable):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        return None

    def put(self, key: Hashable, value: object) -> None:
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
