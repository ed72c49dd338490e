"""Case files of the text environments (clinic, case reasoning): every file given, or every file with a known
suffix inside a given directory, read by the environment's own reader, with duplicate case ids reported and
skipped. One loop for both environments, so both treat paths, missing files and duplicates alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def gather(paths: Iterable[Path], suffixes: tuple[str, ...], read: Callable[[Path], Any], kind: str,
           total: Any) -> Any:  # fmt: skip
    """Fill `total` (an object with `cases` and `problems` lists) from `read(file)` results of the same shape."""
    seen: set[str] = set()
    for path in paths:
        path = Path(path)
        files = sorted(p for p in path.iterdir() if p.suffix in suffixes) if path.is_dir() else [path]
        for file in files:
            if not file.exists():
                raise FileNotFoundError(f"{kind} case file {file} does not exist")
            load = read(file)
            total.problems += load.problems
            for case in load.cases:
                if case.case_id in seen:
                    total.problems.append(
                        f"{file.name}: duplicate case id {case.case_id}, second one skipped"
                    )
                    continue
                seen.add(case.case_id)
                total.cases.append(case)
    return total
