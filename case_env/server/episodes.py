"""Episodes: which case each trajectory is bound to, and its recent calls.

Bindings live in a table the workers share in memory (`bindings.py`), which also decides which episodes are
live: idle ones expire, and past the cap the least recently seen go first. Each worker remembers the
bindings it has seen (a binding never changes while its episode lives) and forgets them when the table
says an episode was dropped, so a reused id is never held to its old case.

Each episode's most recent calls are kept in SQLite for inspection (the audit log is the durable record),
without fsync, written in batches (`flush`, every quarter second and before any read) as one row per episode
and flush, keyed by the episode's integer key: a row per call cost a tenth of a cheap call's server CPU
(docs/performance.md).
"""

from __future__ import annotations

import json
import logging
import random
import sqlite3
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import pydantic_core

from case_env.core.calls import ExecutedCall
from case_env.server.bindings import Bindings

_LAYOUT = 2  # PRAGMA user_version of this layout; a database of another is laid out anew
_SCHEMA = """
DROP TABLE IF EXISTS calls;
DROP TABLE IF EXISTS call_batches;
DROP TABLE IF EXISTS episodes;
CREATE TABLE episodes (
    key INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, patient_id TEXT NOT NULL, created REAL NOT NULL,
    last_seen REAL NOT NULL, calls INTEGER NOT NULL DEFAULT 0);
CREATE TABLE call_batches (
    episode INTEGER NOT NULL, last_seq INTEGER NOT NULL, calls TEXT NOT NULL, PRIMARY KEY (episode, last_seq));
"""

_EPISODES_PER_UPDATE = 150  # 750 parameters a statement: below the 999 that SQLite before 3.32 allows


log = logging.getLogger(__name__)


class Call(NamedTuple):  # a tuple, not a frozen dataclass, whose __init__ cost 2 % of a cheap call
    tool: str
    arguments: dict
    status: str
    http_status: int
    latency_ms: float
    digest: str | None
    fallback: str | None = None  # the tool's model failed and its rules answered: why


class EpisodeLog:
    """Not thread-safe by design: the server touches it only from its event loop."""

    def __init__(self, path: Path | None, idle_s: float, max_episodes: int, max_calls: int):
        self.idle_s = idle_s
        self.max_episodes = max_episodes
        self.max_calls = max_calls
        if path is None:
            target, uri = f"file:episodes-{uuid.uuid4().hex}?mode=memory&cache=private", True
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            target, uri = str(path), False
        self.db = sqlite3.connect(target, uri=uri, isolation_level=None, timeout=10.0)
        self._prepare(wal=path is not None)
        self.bindings = Bindings(
            None if path is None else path.with_name(path.name + "-bindings"), max_episodes
        )
        self._known: OrderedDict[str, str] = OrderedDict()  # episode -> case, while no episode was dropped
        self._deletions = self.bindings.deletions
        self._pending: list[tuple[str, str, Call | None, float]] = []  # (episode, case, call, time)

    def _prepare(self, wal: bool, patience_s: float = 30.0) -> None:
        """Journal mode and layout. Workers starting together race for the new file, and SQLite answers
        "database is locked" to a journal-mode switch at once, without waiting out its busy timeout; so
        retry with jitter. A database of an older layout is laid out anew (its log is an index, not the
        record)."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                if wal:
                    self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=OFF")
                self.db.execute("BEGIN IMMEDIATE")  # one worker lays the file out, the others see it done
                try:
                    if self.db.execute("PRAGMA user_version").fetchone()[0] != _LAYOUT:
                        for statement in _SCHEMA.split(";"):
                            if statement.strip():
                                self.db.execute(statement)
                        self.db.execute(f"PRAGMA user_version = {_LAYOUT}")
                    self.db.execute("COMMIT")
                except BaseException:
                    self.db.execute("ROLLBACK")
                    raise
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(random.uniform(0.01, 0.1))

    def bind(self, episode_id: str, case_id: str, now: float | None = None) -> str:
        """Bind a new episode to a case (or find a known one); returns the bound case."""
        deletions = self.bindings.deletions
        if deletions != self._deletions:  # an episode was dropped somewhere: what is remembered may be stale
            self._known.clear()
            self._deletions = deletions
        known = self._known.get(episode_id)
        if known is not None:
            self._known.move_to_end(episode_id)
            return known
        now = time.time() if now is None else now
        bound, new = self.bindings.claim(episode_id, case_id, now)
        if new:  # the log gets the episode at the next flush, with or without calls
            self._pending.append((episode_id, bound, None, now))
        self._known[episode_id] = bound
        self._known.move_to_end(episode_id)
        while len(self._known) > self.max_episodes:
            self._known.popitem(last=False)
        return bound

    def record(self, episode_id: str, case_id: str, call: Call, now: float | None = None) -> None:
        """Queue a call of an episode bound to `case_id` for its log; `flush` writes the queue."""
        self._pending.append((episode_id, case_id, call, time.time() if now is None else now))

    def flush(self) -> int:
        """Write queued calls in one transaction: the episodes (created, or their counters added to) in a
        statement per few hundred episodes (`_count`), then one row per episode holding its new calls;
        returns how many calls were written. Calls of an episode dropped meanwhile (expired or over the
        cap, perhaps by another worker) are dropped with it."""
        pending, self._pending = self._pending, []
        if not pending:
            return 0
        by_episode: dict[str, _Batch] = {}
        for episode_id, case_id, call, now in pending:
            batch = by_episode.get(episode_id)
            if batch is None:
                batch = by_episode[episode_id] = _Batch(case_id, now)
            if call is not None:
                batch.calls.append(call)
                batch.times.append(now)
            batch.seen = now
        live = self.bindings.touch({episode_id: batch.seen for episode_id, batch in by_episode.items()})
        batches = {episode_id: batch for episode_id, batch in by_episode.items() if episode_id in live}
        written = 0
        self.db.execute("BEGIN IMMEDIATE")
        try:
            rows, trimmed = [], []
            for total, key, episode_id in self._count(batches):
                batch = batches[episode_id]
                if batch.calls:
                    rows.append((key, total, _calls_json(batch)))
                    written += len(batch.calls)
                if total > self.max_calls:
                    trimmed.append((key, total - self.max_calls))
            self.db.executemany("INSERT INTO call_batches VALUES (?, ?, ?)", rows)
            self.db.executemany("DELETE FROM call_batches WHERE episode = ? AND last_seq <= ?", trimmed)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return written

    def _count(self, batches: dict[str, _Batch]) -> list[tuple[int, int, str]]:
        """Create each episode's row or add its new calls to the counter, one statement per few hundred
        episodes rather than one per episode; (calls now, key, episode id) of each."""
        items = list(batches.items())
        counted = []
        for start in range(0, len(items), _EPISODES_PER_UPDATE):
            chunk = items[start : start + _EPISODES_PER_UPDATE]
            values = ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
            parameters = []
            for episode_id, batch in chunk:
                parameters += (episode_id, batch.case_id, batch.first, batch.seen, len(batch.calls))
            counted += self.db.execute(
                f"INSERT INTO episodes (id, patient_id, created, last_seen, calls) VALUES {values} "
                "ON CONFLICT(id) DO UPDATE SET calls = calls + excluded.calls, "
                "last_seen = max(last_seen, excluded.last_seen) RETURNING calls, key, id",
                parameters,
            ).fetchall()
        return counted

    def calls(self, episode_id: str) -> list[ExecutedCall]:
        """The recorded calls of an episode, oldest first (those the cap of calls per episode keeps)."""
        found = self.get(episode_id)
        if found is None:
            return []
        return [ExecutedCall(c["tool"], c["arguments"], c["status"]) for c in found["calls"]]

    def get(self, episode_id: str) -> dict | None:
        """A live episode: its binding from the shared table (a call another worker answered a moment ago
        is already there), its calls from the log as far as the workers have written them."""
        self.flush()
        bound = self.bindings.lookup(episode_id)
        if bound is None:
            return None
        case_id, created, seen = bound
        row = self.db.execute("SELECT key, calls FROM episodes WHERE id = ?", (episode_id,)).fetchone()
        key, total = row if row is not None else (None, 0)
        calls = []
        for last_seq, stored in self.db.execute(
            "SELECT last_seq, calls FROM call_batches WHERE episode = ? ORDER BY last_seq", (key,)
        ):
            batch = json.loads(stored)
            for seq, call in enumerate(batch, start=last_seq - len(batch) + 1):
                if seq > total - self.max_calls:  # a batch straddling the cap keeps its older calls
                    calls.append(_call_record(seq, call))
        return {
            "episode_id": episode_id,
            "patient_id": case_id,
            "created": created,
            "last_seen": seen,
            "calls_total": total,
            "calls": calls,
        }

    def sweep(self, now: float | None = None) -> int:
        """Forget idle episodes and the least recent ones beyond the cap; returns how many were dropped."""
        now = time.time() if now is None else now
        self.flush()
        dropped = self.bindings.expire(now - self.idle_s)
        self.db.execute("BEGIN IMMEDIATE")
        try:
            keys = [
                row[0]
                for episode_id in dropped
                for row in self.db.execute("DELETE FROM episodes WHERE id = ? RETURNING key", (episode_id,))
            ]
            # what no table remembers: episodes of a bindings file laid out anew, or idle past their time
            keys += [
                row[0]
                for row in self.db.execute(
                    "DELETE FROM episodes WHERE last_seen < ? RETURNING key", (now - self.idle_s,)
                )
            ]
            self.db.executemany("DELETE FROM call_batches WHERE episode = ?", [(key,) for key in keys])
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return len(dropped)

    def live(self) -> int:
        """Episodes bound now, across workers."""
        return self.bindings.live

    def close(self) -> None:
        self.flush()
        self.db.close()
        self.bindings.close()


class _Batch:
    """One episode's queued calls at a flush."""

    __slots__ = ("calls", "case_id", "first", "seen", "times")

    def __init__(self, case_id: str, now: float):
        self.case_id = case_id
        self.first = self.seen = now
        self.calls: list[Call] = []
        self.times: list[float] = []


def _calls_json(batch: _Batch) -> str:
    """An episode's calls of one flush as one JSON array, each call a short array (`_call_record` reads
    it), by pydantic-core's serialiser: a tenth of the cost of `json.dumps` of a dict per call. A call that
    cannot be serialised is written with its arguments replaced by the reason, and logged; the other calls
    of the episode, and every other episode of the flush, are written as they are."""
    rows = [_stored(call, now) for call, now in zip(batch.calls, batch.times, strict=True)]
    try:
        return pydantic_core.to_json(rows, fallback=str).decode()
    except (ValueError, RecursionError, pydantic_core.PydanticSerializationError):
        return "[" + ",".join(_one_row(row) for row in rows) + "]"


def _stored(call: Call, now: float) -> tuple:
    return (
        now,
        call.tool,
        call.arguments,
        call.status,
        call.http_status,
        round(call.latency_ms, 3),
        call.digest,
        call.fallback,
    )


def _one_row(row: tuple) -> str:
    try:
        return pydantic_core.to_json(row, fallback=str).decode()
    except (ValueError, RecursionError, pydantic_core.PydanticSerializationError) as exc:
        log.warning("a %s call's arguments could not be written to the episode log: %s", row[1], exc)
        unwritable = {"_unrecorded": f"the arguments could not be written: {type(exc).__name__}"}
        return pydantic_core.to_json((*row[:2], unwritable, *row[3:]), fallback=str).decode()


def _call_record(seq: int, stored: list) -> dict:
    # logs written before the fallback field have seven items
    moment, tool, arguments, status, http_status, latency_ms, digest, fallback = (*stored, None)[:8]
    return {
        "seq": seq,
        "time": moment,
        "tool": tool,
        "arguments": arguments,
        "status": status,
        "http_status": http_status,
        "latency_ms": latency_ms,
        "output_digest": digest,
        "fallback": fallback,
    }
