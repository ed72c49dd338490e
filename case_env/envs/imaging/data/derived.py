"""Small facts derived from decoded volumes (display windows, organ extents), kept as JSON on local disk.

A display window is a pass over both visits' volumes of a channel, an organ's extent a pass over a label
map: milliseconds each, but each worker of each server start used to pay them again for every patient it
met. On a freshly started 2-worker server serving 48 patients they were a fifth of its CPU for the first
seconds (py-spy profile). Stored here once, every worker and every later start reads them instead.

Facts are named by a digest of their kind and key; keys hold the source files' (path, mtime, size), so a
replaced file gets new facts, and `FORMAT`, bumped when a computation changes. Files are written to a
temporary name and renamed into place, so a reader never sees half a file; a file that does not parse is
computed again. The directory is kept to `max_files` files, oldest first, checked when a store opens.
Where the directory cannot be written, facts are computed and not kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("case_env.envs.imaging.data")

FORMAT = 1  # bump when a computation of a stored fact changes


class DerivedFacts:
    def __init__(self, directory: Path, max_files: int = 65536):
        self.directory = directory
        self.max_files = max_files
        self._broken = False  # the directory is not writable: compute, keep nothing
        self._lock = threading.Lock()
        self._prune()

    def fetch(self, kind: str, key: tuple, compute: Callable[[], object]) -> object:
        """The fact of `kind` for `key` (its JSON value), computed and stored on a miss."""
        digest = hashlib.blake2b(repr((FORMAT, kind, key)).encode(), digest_size=20).hexdigest()
        path = self.directory / f"{kind}-{digest}.json"
        try:
            return json.loads(path.read_bytes())
        except (OSError, ValueError):
            pass  # absent, or damaged: compute it again
        value = compute()
        if not self._broken:
            try:
                self._store(path, value)
            except OSError as exc:
                with self._lock:
                    if not self._broken:
                        log.warning("derived-fact directory %s not usable (%s)", self.directory, exc)
                    self._broken = True
        return value

    def _store(self, path: Path, value: object) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        temporary.write_text(json.dumps(value), encoding="utf-8")
        os.replace(temporary, path)

    def _prune(self) -> None:
        try:
            entries = [(entry.stat().st_mtime, entry.path) for entry in os.scandir(self.directory)]
        except OSError:
            return
        for _, path in sorted(entries)[: max(0, len(entries) - self.max_files)]:
            with contextlib.suppress(OSError):
                os.unlink(path)
