"""Decoded volumes on local disk, memory-mapped, so every worker process shares one copy.

A multi-worker server used to decode each `.nii.gz` once per worker and hold a private copy in each: two
workers serving 48 ci patients held 3.3 GB for 1.6 GB of voxels. Here the first worker to need a volume
decodes it once and writes the raw array as `.npy` under the cache directory; every worker (and the next
server start) maps that file read-only. Mapped pages live in the kernel's page cache, shared by all workers
and reclaimable under memory pressure, so the server's proportional memory stays near one copy of the data.

Files are named by a digest of the source file's (path, mtime, size), so a replaced source file is decoded
afresh; the oldest files are deleted when the directory exceeds its byte budget (a mapping outlives the
deletion of its file, so a worker still reading one is unaffected). Files are only ever renamed into place
or unlinked, never rewritten: truncating a mapped file in place would fault the processes reading it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from case_env.envs.imaging.data.nifti import Volume

log = logging.getLogger("case_env.envs.imaging.data")

FORMAT = 1  # bump when the stored layout changes


class DecodedVolumes:
    def __init__(self, directory: Path, max_bytes: int):
        self.directory = directory
        self.max_bytes = max_bytes
        self._broken = False  # the directory is not writable: decode in memory instead
        self._lock = threading.Lock()

    def fetch(self, key: tuple, decode: Callable[[], Volume]) -> Volume:
        """The volume for `key`, mapped from disk; decoded (and stored) on a miss."""
        if self._broken or self.max_bytes <= 0:
            return decode()
        stem = hashlib.blake2b(repr((FORMAT, *key)).encode(), digest_size=20).hexdigest()
        data_path = self.directory / f"{stem}.npy"
        meta_path = self.directory / f"{stem}.json"
        mapped = _open(data_path, meta_path)
        if mapped is not None:
            return mapped
        volume = decode()
        try:
            self._store(volume, data_path, meta_path)
        except OSError as exc:
            with self._lock:
                if not self._broken:
                    log.warning(
                        "decoded-volume directory %s not usable (%s); volumes stay in memory",
                        self.directory,
                        exc.strerror or exc,
                    )
                self._broken = True
            return volume
        return _open(data_path, meta_path) or volume

    def _store(self, volume: Volume, data_path: Path, meta_path: Path) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        suffix = f".{os.getpid()}.{threading.get_ident()}.tmp"
        tmp_data, tmp_meta = (
            data_path.with_name(data_path.name + suffix),
            meta_path.with_name(meta_path.name + suffix),
        )
        with tmp_data.open("wb") as handle:  # a path argument would get ".npy" appended
            np.save(handle, volume.data, allow_pickle=False)
        tmp_meta.write_text(
            json.dumps(
                {
                    "affine": volume.affine.tolist(),
                    "axcodes": list(volume.original_axcodes),
                    "slope": volume.slope,
                    "intercept": volume.intercept,
                }
            )
        )
        # metadata first: a data file is only opened with its metadata present
        os.replace(tmp_meta, meta_path)
        os.replace(tmp_data, data_path)
        self._prune()

    def _prune(self) -> None:
        entries = []
        try:
            for entry in os.scandir(self.directory):
                if entry.name.endswith(".npy"):
                    st = entry.stat()
                    entries.append((st.st_mtime, st.st_size, Path(entry.path)))
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            for victim in (path, path.with_suffix(".json")):
                victim.unlink(missing_ok=True)
            total -= size


def _open(data_path: Path, meta_path: Path) -> Volume | None:
    try:
        meta = json.loads(meta_path.read_text())
        mapped = np.load(data_path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, KeyError):
        return None  # absent, half-pruned or damaged: decode again
    _read_ahead(data_path)
    # a plain ndarray over the mapping: slicing a np.memmap runs Python code per slice (3 % of server time)
    data = np.asarray(mapped)
    return Volume(
        data=data,
        affine=np.asarray(meta["affine"]),
        original_axcodes=tuple(meta["axcodes"]),
        slope=float(meta["slope"]),
        intercept=float(meta["intercept"]),
    )


def _read_ahead(path: Path) -> None:
    """Ask the kernel to bring the file into the page cache in the background. Warm renders run on the
    event loop (case_env.core.resident), where a page evicted since the file was written would otherwise
    fault in from disk while every other call of the worker waits."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
