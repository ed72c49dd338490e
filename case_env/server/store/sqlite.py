"""The embedded episode store: one SQLite file (WAL) that every worker of one host opens.

Each call is one short write transaction, committed before the call's answer leaves: a worker killed with
SIGKILL loses nothing it acknowledged (the commit is in the operating system's hands; `synchronous=NORMAL`
syncs the log at checkpoints, so a power cut may lose the last moments, a killed process does not). The
statements run on the event loop: each takes tens of microseconds, less than handing it to a thread.
"""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from case_env.core.calls import Call
from case_env.server.store import Binding, Episode, EpisodeStore, StoreUnavailableError

_LAYOUT = 3  # PRAGMA user_version of this layout; a file of another is laid out anew
_SCHEMA = """
DROP TABLE IF EXISTS calls;
DROP TABLE IF EXISTS call_batches;
DROP TABLE IF EXISTS episodes;
DROP TABLE IF EXISTS counts;
CREATE TABLE episodes (
    id TEXT PRIMARY KEY, case_id TEXT NOT NULL, env TEXT NOT NULL, context TEXT, row TEXT,
    created REAL NOT NULL, last_seen REAL NOT NULL, calls_total INTEGER NOT NULL DEFAULT 0,
    reward TEXT, live INTEGER NOT NULL DEFAULT 1) WITHOUT ROWID;
CREATE INDEX episodes_by_age ON episodes (live, last_seen);
CREATE TABLE calls (
    episode TEXT NOT NULL, seq INTEGER NOT NULL, call TEXT NOT NULL, PRIMARY KEY (episode, seq)) WITHOUT ROWID;
CREATE TABLE counts (name TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO counts VALUES ('episodes', 0);
"""


class SQLiteStore(EpisodeStore):
    """Not thread-safe by design: a worker touches it only from its event loop."""

    name = "sqlite"

    def __init__(self, path: Path | None, idle_s: float, max_episodes: int, max_calls: int):
        super().__init__(idle_s, max_episodes, max_calls)
        if path is None:
            target, uri = f"file:episodes-{uuid.uuid4().hex}?mode=memory&cache=private", True
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            target, uri = str(path), False
        self.db = sqlite3.connect(target, uri=uri, isolation_level=None, timeout=10.0)
        self._prepare(wal=path is not None)

    def _prepare(self, wal: bool, patience_s: float = 30.0) -> None:
        """Journal mode and layout. Workers starting together race for a new file, and SQLite answers
        "database is locked" to a journal-mode switch at once, without waiting out its busy timeout; so
        retry with jitter."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                if wal:
                    self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
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

    def _writing(self):
        return _Transaction(self.db)

    async def _lookup(self, episode_id: str, with_calls: bool) -> tuple[Binding | None, list[Call]]:
        found = self._binding(episode_id)
        return found, self._calls(episode_id) if with_calls and found is not None else []

    async def _bind(self, episode_id: str, binding: Binding, now: float) -> Binding:
        with self._writing():
            self._create(episode_id, binding, now)
        found = self._binding(episode_id)
        assert found is not None
        return found

    def _create(self, episode_id: str, binding: Binding, now: float) -> None:
        """The episode's row, unless it has one; past the cap the least recently used go, ended ones first."""
        created = self.db.execute(
            "INSERT INTO episodes (id, case_id, env, context, row, created, last_seen) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO NOTHING",
            (episode_id, binding.case_id, binding.env, binding.context, binding.row, now, now),
        ).rowcount
        if created:
            held = self.db.execute(
                "UPDATE counts SET n = n + 1 WHERE name = 'episodes' RETURNING n"
            ).fetchone()[0]
            if held > self.max_episodes:
                self._evict(held - self.max_episodes)

    def _binding(self, episode_id: str) -> Binding | None:
        row = self.db.execute(
            "SELECT case_id, env, context, row, reward IS NOT NULL FROM episodes WHERE id = ?", (episode_id,)
        ).fetchone()
        return None if row is None else Binding(row[0], row[1], row[2], row[3], bool(row[4]))

    def _evict(self, n: int) -> None:
        """The `n` least recently used episodes, ended ones first."""
        gone = self.db.execute(
            "DELETE FROM episodes WHERE id IN "
            "(SELECT id FROM episodes ORDER BY live, last_seen LIMIT ?) RETURNING id",
            (n,),
        ).fetchall()
        self._forget([g[0] for g in gone])

    def _forget(self, ids: list[str]) -> None:
        self.db.executemany("DELETE FROM calls WHERE episode = ?", [(i,) for i in ids])
        self.db.execute("UPDATE counts SET n = n - ? WHERE name = 'episodes'", (len(ids),))

    def _calls(self, episode_id: str) -> list[Call]:
        rows = self.db.execute(
            "SELECT call FROM calls WHERE episode = ? ORDER BY seq", (episode_id,)
        ).fetchall()
        return [Call.model_validate_json(row[0]) for row in rows]

    async def _append(self, episode_id: str, binding: Binding, call: Call, now: float) -> Binding:
        with self._writing():
            self._create(episode_id, binding, now)
            counted = self.db.execute(
                "UPDATE episodes SET calls_total = calls_total + 1, last_seen = ? "
                "WHERE id = ? AND case_id = ? AND context IS ? AND reward IS NULL RETURNING calls_total",
                (now, episode_id, binding.case_id, binding.context),
            ).fetchone()
            if counted is None:  # bound to another case or settings, or ended: nothing recorded
                found = self._binding(episode_id)
                assert found is not None
                return found
            seq = counted[0]
            record = call.model_copy(update={"seq": seq, "time": now}).model_dump_json(exclude_none=True)
            self.db.execute("INSERT INTO calls VALUES (?, ?, ?)", (episode_id, seq, record))
            if seq > self.max_calls:
                self.db.execute(
                    "DELETE FROM calls WHERE episode = ? AND seq <= ?", (episode_id, seq - self.max_calls)
                )
        return binding

    async def _end(self, episode_id: str, reward: dict[str, Any], now: float) -> dict[str, Any] | None:
        with self._writing():
            ended = self.db.execute(
                "UPDATE episodes SET reward = ?, live = 0, last_seen = ? WHERE id = ? AND reward IS NULL "
                "RETURNING reward",
                (json.dumps(reward, default=str), now, episode_id),
            ).fetchone()
            if ended is None:
                ended = self.db.execute("SELECT reward FROM episodes WHERE id = ?", (episode_id,)).fetchone()
        return None if ended is None else json.loads(ended[0])

    async def get(self, episode_id: str) -> Episode | None:
        row = self.db.execute(
            "SELECT case_id, env, context, row, reward, created, last_seen, calls_total FROM episodes "
            "WHERE id = ?",
            (episode_id,),
        ).fetchone()
        if row is None:
            return None
        case_id, env, context, bank_row, reward, created, seen, total = row
        binding = Binding(case_id, env, context, bank_row, reward is not None)
        kept = json.loads(reward) if reward is not None else None
        return Episode(episode_id, binding, created, seen, total, self._calls(episode_id), kept)

    async def live(self, now: float) -> int:
        return self.db.execute("SELECT count(*) FROM episodes WHERE live = 1").fetchone()[0]

    async def sweep(self, now: float) -> int:
        with self._writing():
            gone = self.db.execute(
                "DELETE FROM episodes WHERE last_seen < ? RETURNING id", (now - self.idle_s,)
            ).fetchall()
            if gone:
                self._forget([g[0] for g in gone])
        return len(gone)

    async def ping(self) -> None:
        try:
            self.db.execute("SELECT 1").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"the episode file cannot be read ({exc})") from None

    async def close(self) -> None:
        self.db.close()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error; SQLite's own errors (a full disk, a file
    locked past the busy timeout) as StoreUnavailableError, which the server answers 503."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"the episode file cannot be written ({exc})") from None

    def __exit__(self, kind, exc, tb) -> bool:
        try:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")
        except sqlite3.Error as failed:
            exc = exc or failed
            if self.db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise StoreUnavailableError(f"the episode file cannot be written ({exc})") from None
        return False
