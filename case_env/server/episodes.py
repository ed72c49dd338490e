"""Episodes: which patient each trajectory is bound to, and its recent calls.

Kept in SQLite so that every worker of a multi-worker server sees the same bindings: a trajectory whose
calls land on different workers is still held to one patient. Bounded three ways: idle episodes expire,
the number of episodes is capped (least recently seen go first) and each episode keeps only its most
recent calls. The episode log is an index for inspection; the audit log is the durable record, so the
database runs without fsync, and calls are written in batches (`flush`, every few milliseconds and before
any read) rather than one transaction per call.

A binding never changes while its episode lives, so each worker remembers the bindings it has seen and
asks the database only about new episodes; a remembered binding is dropped when its episode could have
expired, so a swept episode id is never held to its old patient.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

_SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, created REAL NOT NULL, last_seen REAL NOT NULL,
    calls INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS episodes_last_seen ON episodes(last_seen);
CREATE TABLE IF NOT EXISTS calls (
    episode_id TEXT NOT NULL, seq INTEGER NOT NULL, time REAL NOT NULL, tool TEXT NOT NULL,
    arguments TEXT NOT NULL, status TEXT NOT NULL, http_status INTEGER NOT NULL, latency_ms REAL NOT NULL,
    digest TEXT, PRIMARY KEY (episode_id, seq));
"""

_EPISODES_PER_UPDATE = 300  # 900 parameters a statement: below the 999 that SQLite before 3.32 allows


class Call(NamedTuple):  # a tuple, not a frozen dataclass, whose __init__ cost 2 % of a cheap call
    tool: str
    arguments: dict
    status: str
    http_status: int
    latency_ms: float
    digest: str | None


class EpisodeStore:
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
        self._known: OrderedDict[str, tuple[str, float]] = OrderedDict()  # episode -> (patient, bound at)
        self._pending: list[tuple[str, Call, float]] = []

    def _prepare(self, wal: bool, patience_s: float = 30.0) -> None:
        """Journal mode and schema. Workers starting together race for the new file, and SQLite answers
        "database is locked" to a journal-mode switch at once, without waiting out its busy timeout; so
        retry with jitter."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                if wal:
                    self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=OFF")
                self.db.executescript(_SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(random.uniform(0.01, 0.1))

    def bind(self, episode_id: str, patient_id: str, now: float | None = None) -> str:
        """Bind a new episode to a patient (or touch a known one); returns the bound patient."""
        now = time.time() if now is None else now
        known = self._known.get(episode_id)
        # a remembered binding is trusted for half the idle time: the episode cannot have expired since
        if known is not None and now - known[1] < self.idle_s / 2:
            self._known.move_to_end(episode_id)
            return known[0]
        row = self.db.execute(
            "INSERT INTO episodes (id, patient_id, created, last_seen) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET last_seen = excluded.last_seen RETURNING patient_id",
            (episode_id, patient_id, now, now),
        ).fetchone()
        self._known[episode_id] = (row[0], now)
        self._known.move_to_end(episode_id)
        while len(self._known) > self.max_episodes:
            self._known.popitem(last=False)
        return row[0]

    def record(self, episode_id: str, call: Call, now: float | None = None) -> None:
        """Queue a call for the episode's log; `flush` writes the queue."""
        self._pending.append((episode_id, call, time.time() if now is None else now))

    def flush(self) -> int:
        """Write queued calls in one transaction: the episodes' counters in a statement per few hundred
        episodes (`_count`), the rows in one batch; returns how many were written."""
        pending, self._pending = self._pending, []
        if not pending:
            return 0
        by_episode: dict[str, list[tuple[Call, float]]] = {}
        for episode_id, call, now in pending:
            by_episode.setdefault(episode_id, []).append((call, now))
        self.db.execute("BEGIN IMMEDIATE")
        try:
            rows, trimmed = [], []
            for total, episode_id in self._count(by_episode):  # episodes swept meanwhile are not returned
                calls = by_episode[episode_id]
                first = total - len(calls) + 1
                rows += [_row(episode_id, first + i, call, now) for i, (call, now) in enumerate(calls)]
                if total > self.max_calls:
                    trimmed.append((episode_id, total - self.max_calls))
            self.db.executemany("INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self.db.executemany("DELETE FROM calls WHERE episode_id = ? AND seq <= ?", trimmed)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return len(pending)

    def _count(self, by_episode: dict[str, list[tuple[Call, float]]]) -> list[tuple[int, str]]:
        """Add each episode's new calls to its counter, one statement per few hundred episodes rather than
        one per episode; (calls now, episode id) of the episodes that still exist."""
        items = list(by_episode.items())
        counted = []
        for start in range(0, len(items), _EPISODES_PER_UPDATE):
            chunk = items[start : start + _EPISODES_PER_UPDATE]
            values = ", ".join(["(?, ?, ?)"] * len(chunk))
            counted += self.db.execute(
                "UPDATE episodes SET calls = calls + v.column2, last_seen = v.column3 "
                f"FROM (VALUES {values}) AS v WHERE episodes.id = v.column1 RETURNING calls, id",
                [x for episode_id, calls in chunk for x in (episode_id, len(calls), calls[-1][1])],
            ).fetchall()
        return counted

    def get(self, episode_id: str) -> dict | None:
        self.flush()
        row = self.db.execute(
            "SELECT patient_id, created, last_seen, calls FROM episodes WHERE id = ?", (episode_id,)
        ).fetchone()
        if row is None:
            return None
        calls = self.db.execute(
            "SELECT seq, time, tool, arguments, status, http_status, latency_ms, digest FROM calls "
            "WHERE episode_id = ? ORDER BY seq",
            (episode_id,),
        ).fetchall()
        return {
            "episode_id": episode_id,
            "patient_id": row[0],
            "created": row[1],
            "last_seen": row[2],
            "calls_total": row[3],
            "calls": [
                {
                    "seq": c[0],
                    "time": c[1],
                    "tool": c[2],
                    "arguments": json.loads(c[3]),
                    "status": c[4],
                    "http_status": c[5],
                    "latency_ms": c[6],
                    "output_digest": c[7],
                }
                for c in calls
            ],
        }

    def sweep(self, now: float | None = None) -> int:
        """Forget idle episodes and the least recent ones beyond the cap; returns how many were dropped."""
        now = time.time() if now is None else now
        self.flush()
        self._known.clear()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            dropped = self.db.execute(
                "DELETE FROM episodes WHERE last_seen < ? RETURNING id", (now - self.idle_s,)
            ).fetchall()
            excess = self.live() - self.max_episodes
            if excess > 0:
                dropped += self.db.execute(
                    "DELETE FROM episodes WHERE id IN (SELECT id FROM episodes ORDER BY last_seen LIMIT ?) RETURNING id",
                    (excess,),
                ).fetchall()
            self.db.execute("DELETE FROM calls WHERE episode_id NOT IN (SELECT id FROM episodes)")
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return len(dropped)

    def live(self) -> int:
        self.flush()
        return self.db.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]

    def close(self) -> None:
        self.flush()
        self.db.close()


# one encoder for every row: json.dumps with options builds a new one on each call
_ARGUMENTS_JSON = json.JSONEncoder(default=str).encode


def _row(episode_id: str, seq: int, call: Call, now: float) -> tuple:
    arguments = _ARGUMENTS_JSON(call.arguments)
    latency = round(call.latency_ms, 3)
    return (episode_id, seq, now, call.tool, arguments, call.status, call.http_status, latency, call.digest)
