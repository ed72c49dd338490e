"""Case files of environments whose cases are rows of text files: every file given, or every file with a known
suffix inside a given directory, read by the environment's own reader, with duplicate case ids reported and
skipped. One loop for all of them, so all treat paths, missing files and duplicates alike."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

# a split named as a word of the file name: "train-00000-of-00001.parquet" (MedCaseReasoning), "train_patients.csv",
# "ddxplus_test_conversations_clean.jsonl" (MedExAgent)
_SPLIT = re.compile(r"(?:^|[-_.])(train|val|validation|test)(?=$|[-_.])", re.IGNORECASE)
SPLIT_NAMES = {"train": "train", "val": "val", "validation": "val", "test": "test"}


def split_of(path: Path) -> str:
    """The split a file's name gives its cases, or "": a published dataset's own split, which banks keep."""
    found = _SPLIT.search(path.name)
    return SPLIT_NAMES[found.group(1).lower()] if found else ""


def records(path: Path) -> Iterator[tuple[int, str, dict | None, str | None]]:
    """(number, where, row, problem) for every row of a JSONL, CSV or parquet file: `number` is the 0-based
    row of a table or the line of a JSONL file, `where` names it for messages, and a line that is not a JSON
    object comes with row None and the reason."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for n, row in enumerate(pq.read_table(path).to_pylist()):
            yield n, f"{path.name} row {n}", row, None
    elif path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            for n, row in enumerate(csv.DictReader(handle)):
                yield n, f"{path.name} row {n + 2}", row, None
    else:
        with path.open(encoding="utf-8") as handle:
            for n, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{path.name} line {n}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield n, where, None, f"not JSON ({exc.msg})"
                    continue
                yield (
                    (n, where, row, None) if isinstance(row, dict) else (n, where, None, "not a JSON object")
                )


def gather(
    paths: Iterable[Path], suffixes: tuple[str, ...], read: Callable[[Path], Any], kind: str, total: Any
) -> Any:
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
