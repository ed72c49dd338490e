"""Tab-separated files as BIDS writes them: a header row, one record per line, `n/a` for missing.

The csv module accepts ragged rows silently; a user's hand-edited sessions.tsv with a missing tab must
instead fail with the row number, so parsing is done by hand.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np


class TsvError(ValueError):
    """A TSV file that cannot be parsed; the message names the row and the problem."""


def _cell(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, float | np.floating):
        value = float(value)
        return f"{value:.6g}" if abs(value) >= 1e5 else repr(round(value, 6))
    return str(value)


def write_tsv(path: Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    lines = ["\t".join(header)]
    lines += ["\t".join(_cell(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_tsv(path: Path, required: Sequence[str] = ()) -> list[dict[str, str]]:
    """Rows as dicts keyed by header. Raises TsvError naming the first problem found."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TsvError(f"not UTF-8 text (byte {exc.start})") from exc
    lines = [line.rstrip("\r") for line in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise TsvError("empty file (expected a header row)")
    header = [h.strip() for h in lines[0].split("\t")]
    if len(set(header)) != len(header):
        raise TsvError(f"duplicate column names in header {header}")
    missing = [c for c in required if c not in header]
    if missing:
        raise TsvError(f"missing column(s) {', '.join(missing)} (header is {', '.join(header)})")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split("\t")]
        if len(cells) != len(header):
            raise TsvError(f"line {number} has {len(cells)} field(s), the header has {len(header)}")
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def read_table(path: Path) -> list[dict[str, str]]:
    """A TSV, or a comma-separated export when the name ends in .csv (what the UK Biobank showcase and RAP
    tools write). Raises TsvError naming the problem."""
    if path.suffix.lower() != ".csv":
        return read_tsv(path)
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            return [{k.strip(): (v or "").strip() for k, v in r.items() if k} for r in csv.DictReader(handle)]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TsvError(f"not a readable CSV file ({exc})") from exc
