"""Episode bindings shared by the workers of one server: which case each live episode may read.

Scope must hold across workers from an episode's first call on, against clients racing first calls with
different cases, at microseconds a call: a binding is a slot of an open-addressing hash table in a
memory-mapped file, changed under `flock` (docs/performance.md has what a database row cost instead). The
table decides which episodes are live (`claim`, `touch`, `expire`), and tells the episode log what it drops.

A slot (224 bytes): state, the two ids' lengths, a keyed 64-bit hash of the episode id, bound and seen times,
the episode id (128 bytes) and the case id (64). Linear probing; a deletion shifts the run after it back
(Knuth's algorithm R), so no tombstones pile up. A claim writes the state byte last, so a worker killed
mid-claim leaves the slot empty; the live count is recounted whenever the file opens.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
from pathlib import Path

import numpy as np

MAGIC = b"CEBIND02"
_HEADER = struct.Struct("<8sIIQQQ16s")  # magic, slot size, reserved, capacity, live, deletions, hash key
_COUNT = struct.Struct("<Q")
_LIVE, _DELETIONS = 24, 32  # offsets of the two counters in the header
_HEADER_BYTES = mmap.PAGESIZE
_SLOT = struct.Struct("<BBB5xQdd128s64s")  # state, episode length, case length, hash, bound, seen, ids
_SEEN = 24  # offset of `last_seen` within a slot
_SLOT_DTYPE = np.dtype(
    {
        "names": ["state", "hash", "seen"],
        "formats": ["u1", "<u8", "<f8"],
        "offsets": [0, 8, 24],
        "itemsize": _SLOT.size,
    }
)
_EMPTY = bytes(_SLOT.size)
LOAD = 2  # slots per episode allowed by the cap: linear probing stays short below half full


def _hash(episode: bytes, key: bytes) -> int:
    """The same in every worker of a file (Python's own `hash` of a str is salted per process), keyed by the
    file's random key, so a client cannot choose episode ids that all probe from one slot."""
    return int.from_bytes(hashlib.blake2b(episode, digest_size=8, key=key).digest(), "little")


class Bindings:
    """Episode → case for every worker of a server. `path` None: this process only (one worker, an
    in-memory episode log), with no file and no lock. Not thread-safe within a process: the server uses it
    from its event loop only."""

    def __init__(self, path: Path | None, max_episodes: int):
        self.max_episodes = max_episodes
        wanted = 64
        while wanted < LOAD * max_episodes:
            wanted *= 2
        self._fd: int | None = None
        if path is None:
            self.capacity = wanted
            self._map = mmap.mmap(-1, _HEADER_BYTES + wanted * _SLOT.size)
            _HEADER.pack_into(self._map, 0, MAGIC, _SLOT.size, 0, wanted, 0, 0, os.urandom(16))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # workers starting together: one lays the file out
            try:
                self.capacity = self._open_file(wanted)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._mask = self.capacity - 1
        self._key = _HEADER.unpack_from(self._map, 0)[6]
        self._slots = np.frombuffer(self._map, _SLOT_DTYPE, self.capacity, _HEADER_BYTES)
        if self._fd is not None:
            with self:
                self._set_live(int(np.count_nonzero(self._slots["state"] == 1)))

    def _open_file(self, wanted: int) -> int:
        """Map the file, laying it out first when it is new, not a bindings file of this layout or too small
        for the cap (its bindings are then lost, as after a restart without a database); returns the slot
        count."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size >= _HEADER_BYTES:
            magic, slot, _, capacity, _, _, _ = _HEADER.unpack(os.pread(self._fd, _HEADER.size, 0))
            whole = size == _HEADER_BYTES + capacity * _SLOT.size
            if magic == MAGIC and slot == _SLOT.size and whole and capacity >= wanted:
                self._map = mmap.mmap(self._fd, size)
                return capacity
        os.ftruncate(self._fd, 0)  # a sparse file of zeros: every slot empty
        os.ftruncate(self._fd, _HEADER_BYTES + wanted * _SLOT.size)
        os.pwrite(self._fd, _HEADER.pack(MAGIC, _SLOT.size, 0, wanted, 0, 0, os.urandom(16)), 0)
        self._map = mmap.mmap(self._fd, _HEADER_BYTES + wanted * _SLOT.size)
        return wanted

    # -- the lock: shared by every worker of the file, a no-op without one ---------------------------------
    def __enter__(self) -> Bindings:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    @property
    def live(self) -> int:
        """Episodes bound now (read without the lock: a count, exact once no claim is in progress)."""
        return _COUNT.unpack_from(self._map, _LIVE)[0]

    @property
    def deletions(self) -> int:
        """Episodes dropped so far, by any worker (read without the lock): while it stays the same, every
        binding a worker has seen still holds, so it may answer from memory."""
        return _COUNT.unpack_from(self._map, _DELETIONS)[0]

    def _set_live(self, count: int) -> None:
        _COUNT.pack_into(self._map, _LIVE, count)

    # -- calls ---------------------------------------------------------------------------------------------
    def claim(self, episode_id: str, case_id: str, now: float) -> tuple[str, bool]:
        """The case `episode_id` is bound to, binding it to `case_id` if it is not bound yet; and
        whether this call bound it. Both ids are ASCII (the request model's patterns)."""
        episode, case = episode_id.encode("ascii"), case_id.encode("ascii")
        if len(episode) > _EPISODE_BYTES or len(case) > _CASE_BYTES:  # a slot would cut, not keep, it
            what, length = ("episode", len(episode)) if len(episode) > _EPISODE_BYTES else ("case", len(case))
            raise ValueError(
                f"{what} id of {length} characters; a binding holds {_EPISODE_BYTES} and {_CASE_BYTES}"
            )
        key = _hash(episode, self._key)
        with self:
            index, found = self._find(episode, key)
            if found is not None:
                _SLOT_SEEN.pack_into(self._map, self._offset(index) + _SEEN, now)
                return found, False
            if self.live >= self.max_episodes:  # the cap: the least recently seen make room
                self._evict(self.live - self.max_episodes + 1)
                index, _ = self._find(episode, key)
            offset = self._offset(index)
            record = _SLOT.pack(0, len(episode), len(case), key, now, now, episode, case)
            self._map[offset + 1 : offset + _SLOT.size] = record[1:]
            self._map[offset] = 1  # last: a slot is bound only once it is whole
            self._set_live(self.live + 1)
        return case_id, True

    def lookup(self, episode_id: str) -> tuple[str, float, float] | None:
        """(case, bound at, last seen) of a bound episode, or None."""
        episode = episode_id.encode("ascii")
        with self:
            index, found = self._find(episode, _hash(episode, self._key))
            if found is None:
                return None
            _, _, _, _, created, seen, _, _ = _SLOT.unpack_from(self._map, self._offset(index))
        return found, created, seen

    def touch(self, seen: dict[str, float]) -> set[str]:
        """Mark episodes seen at the given times; returns those still bound (the others were dropped)."""
        bound = set()
        with self:
            for episode_id, now in seen.items():
                episode = episode_id.encode("ascii")
                index, found = self._find(episode, _hash(episode, self._key))
                if found is not None:
                    offset = self._offset(index) + _SEEN
                    if _SLOT_SEEN.unpack_from(self._map, offset)[0] < now:
                        _SLOT_SEEN.pack_into(self._map, offset, now)
                    bound.add(episode_id)
        return bound

    def expire(self, idle_before: float) -> list[str]:
        """Drop episodes last seen before `idle_before`, then the least recently seen beyond the cap;
        returns the ids dropped."""
        with self:
            used = np.flatnonzero(self._slots["state"] == 1)
            seen = self._slots["seen"][used]
            idle = used[seen < idle_before]
            dropped = [self._episode(index) for index in idle]
            for episode in dropped:
                self._delete(episode)
            excess = self.live - self.max_episodes
            if excess > 0:
                dropped += self._evict(excess)
        return dropped

    def close(self) -> None:
        self._slots = None  # the numpy view holds a buffer of the map: release it first
        self._map.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- the table (callers hold the lock) -----------------------------------------------------------------
    def _offset(self, index: int) -> int:
        return _HEADER_BYTES + index * _SLOT.size

    def _find(self, episode: bytes, key: int) -> tuple[int, str | None]:
        """(slot, bound case) of a bound episode, or (the empty slot its claim takes, None)."""
        index = key & self._mask
        for _ in range(self.capacity):
            offset = self._offset(index)
            state, elen, plen, stored = _SLOT_HEAD.unpack_from(self._map, offset)
            if state == 0:
                return index, None
            if stored == key and self._map[offset + _IDS : offset + _IDS + elen] == episode:
                start = offset + _IDS + _EPISODE_BYTES
                return index, self._map[start : start + plen].decode("ascii")
            index = (index + 1) & self._mask
        # unreachable while the cap holds: `claim` evicts before the table is more than half full
        raise RuntimeError(f"all {self.capacity} episode slots are bound")

    def _episode(self, index: int) -> str:
        _, elen, _, _, _, _, episode, _ = _SLOT.unpack_from(self._map, self._offset(index))
        return episode[:elen].decode("ascii")

    def _evict(self, count: int) -> list[str]:
        """Drop the `count` least recently seen episodes; returns their ids."""
        used = np.flatnonzero(self._slots["state"] == 1)
        count = min(count, len(used))
        if count <= 0:
            return []
        oldest = used[np.argpartition(self._slots["seen"][used], count - 1)[:count]]
        dropped = [self._episode(index) for index in oldest]
        for episode in dropped:
            self._delete(episode)
        return dropped

    def _delete(self, episode_id: str) -> None:
        """Empty an episode's slot and shift back the run after it, so every episode stays reachable from
        its home slot without passing an empty one."""
        episode = episode_id.encode("ascii")
        hole, found = self._find(episode, _hash(episode, self._key))
        if found is None:
            return
        index = hole
        while True:
            index = (index + 1) & self._mask
            offset = self._offset(index)
            if self._map[offset] == 0:
                break
            home = _SLOT_HASH.unpack_from(self._map, offset + 8)[0] & self._mask
            # the entry at `index` may move into the hole unless its home lies cyclically in (hole, index]
            if (index - home) & self._mask >= (index - hole) & self._mask:
                start = self._offset(hole)
                self._map[start : start + _SLOT.size] = self._map[offset : offset + _SLOT.size]
                hole = index
        start = self._offset(hole)
        self._map[start : start + _SLOT.size] = _EMPTY
        self._set_live(self.live - 1)
        _COUNT.pack_into(self._map, _DELETIONS, self.deletions + 1)


_SLOT_HEAD = struct.Struct("<BBB5xQ")  # what a probe reads: state, the id lengths, the hash
_SLOT_SEEN = struct.Struct("<d")
_SLOT_HASH = struct.Struct("<Q")
_IDS, _EPISODE_BYTES, _CASE_BYTES = 32, 128, 64  # where the ids start in a slot, and their room
