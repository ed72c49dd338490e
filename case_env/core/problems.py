"""A list of problems that, when shown cut short, says how many more there are and where the rest is."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

SHOWN = 20


class Problems(list):
    """Problem lines (rows skipped, questions left out, files that could not be read), in order."""

    def __init__(self, items: Iterable[Any] = ()):
        super().__init__(str(i) for i in items)

    def shown(self, limit: int = SHOWN, where: str | None = None) -> list[str]:
        """The first `limit` lines, and one more line saying how many were left out."""
        lines = list(self[:limit])
        if len(self) > limit:
            rest = f" (all {len(self)} in {where})" if where else ""
            lines.append(f"... and {len(self) - limit} more{rest}")
        return lines

    def echo(
        self, emit: Callable[[str], Any], prefix: str = "", limit: int = SHOWN, where: str | None = None
    ) -> None:
        for line in self.shown(limit, where):
            emit(f"{prefix}{line}")

    def to_json(self) -> list[str]:
        return list(self)


def describe_errors(errors: list[dict], prefix: tuple = ()) -> str:
    """Validation errors as one line of `where: what` parts (the first five), `prefix` before each place."""
    problems = []
    for error in errors[:5]:
        if error.get("type") == "json_invalid":
            problems.append("the body is not valid JSON")
            continue
        where = ".".join(str(p) for p in (*prefix, *error.get("loc", ())) if p != "body") or "body"
        problems.append(f"{where}: {error.get('msg', 'invalid')}")
    more = len(errors) - 5
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")
