"""case-env tests."""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def blocking(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """A coroutine function called as a plain one (`asyncio.run`), as a plain caller of a reward does."""

    def called(*args: P.args, **kwargs: P.kwargs) -> T:
        return asyncio.run(function(*args, **kwargs))

    return called
