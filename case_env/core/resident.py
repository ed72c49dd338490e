"""Answering a call on the event loop when everything it reads is already in memory.

Handing a call to a pool thread and back costs the server's event loop about 0.45 ms of CPU on a 2-core VM
(the wake-up of an idle thread, measured by `case-env bench render`, `thread_hop_ms`): more than a text
tool's whole answer and a fifth of a render. Most calls of a warm case need no I/O at all, so a tool that
declares `resident=True` is first run on the loop under `resident_only()`; its store calls
`require_resident()` before anything that could block or take long (a file read, a decode, a one-time pass
over a volume), which raises `NotResidentError` there, and the server then runs the call in its pool as
before. The work done before the raise is repeated in the pool; it happens once per file per worker, the
first time a case is touched.
A stat is not refused: the response cache's key stats a case's files on the loop anyway (once per
`stat_ttl_s`), and pages of a memory-mapped volume that the kernel evicted fault back in from local disk.

A tool may declare itself resident only when every read of its handler goes through such a store: a
handler that opens a file or a connection of its own would block the loop.
"""

from __future__ import annotations

from contextvars import ContextVar

_resident_only: ContextVar[bool] = ContextVar("case_env_resident_only", default=False)


class NotResidentError(Exception):
    """The call needs I/O (the message names it), which must not happen on the event loop."""


def on_loop() -> bool:
    """True inside `resident_only()`: nothing may block (nor wait for another thread's load)."""
    return _resident_only.get()


def require_resident(what: str) -> None:
    """Called by a store before blocking or slow work; raises NotResidentError inside `resident_only()`."""
    if _resident_only.get():
        raise NotResidentError(what)


class _ResidentOnly:
    # a class, not @contextlib.contextmanager: the generator machinery cost 2 % of a cheap call
    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _resident_only.set(True)

    def __exit__(self, *exc: object) -> None:
        _resident_only.reset(self._token)


def resident_only() -> _ResidentOnly:
    """Within this block, `require_resident` refuses: the code runs on the event loop."""
    return _ResidentOnly()
