"""Process-wide memory behaviour for long-running processes that cycle large arrays through a cache.

glibc raises its mmap threshold each time a large block is freed, so later volume-sized buffers come from
the heap and their memory is rarely returned to the system: resident memory then drifts above the cache
budget as volumes are evicted and reloaded. Fixing the threshold keeps every large buffer mmap-backed and
returned on free (measured by `case-env bench data`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_MMAP_THRESHOLD = -3  # from malloc.h
_THRESHOLD_BYTES = 1 << 20


@functools.cache  # once per process: finding libc runs a subprocess, and the setting is process-wide
def release_freed_memory_promptly() -> bool:
    """Pin glibc's mmap threshold; returns False where there is no glibc (nothing to do there)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
