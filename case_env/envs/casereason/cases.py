"""MedCaseReasoning rows: `case_prompt` (the presentation before the differential), `diagnostic_reasoning`
(numbered clinician statements) and `final_diagnosis`, with PMC metadata (`pmcid`, `title`, `journal`,
`article_link`, `publication_date`), from JSONL, CSV or parquet (docs/sources.md, MedCaseReasoning).

The dataset as Hugging Face serves it (`zou-lab/MedCaseReasoning`: `data/train-00000-of-00001.parquet`,
`val-…`, `test-…`) loads by directory, the snapshot's or its `data/`; a file named after a split (`train`,
`val` or `validation`, `test`, alone or before `-`, `_` or `.`) gives its cases that split, which a bank
keeps.

A row without a prompt or a diagnosis is skipped and reported. Case ids are the PMCID when the row has one,
else `<file stem>-<row>`; either way they are what the bank's rows and the server's `submit_diagnosis` name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from case_env.core.casefiles import gather, records, split_of

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_NUMBERED = re.compile(r"(?:^|\n|\s)(\d{1,2})[.)]\s+")
SUFFIXES = (".jsonl", ".csv", ".parquet")


@dataclass(frozen=True)
class ReasoningCase:
    case_id: str
    prompt: str
    statements: tuple[str, ...]
    diagnosis: str
    title: str = ""
    journal: str = ""
    pmcid: str = ""
    split: str = ""  # the dataset's own split, from the file name


@dataclass
class ReasoningLoad:
    cases: list[ReasoningCase] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def statements(text: str) -> tuple[str, ...]:
    """'1. A was considered ... 2. B ...' → ('A was considered ...', 'B ...'); unnumbered text is one statement
    per non-empty line."""
    text = (text or "").strip()
    if not text:
        return ()
    marks = list(_NUMBERED.finditer(text))
    if len(marks) < 2 and not text[:3].strip()[:1].isdigit():
        return tuple(line.strip() for line in text.splitlines() if line.strip())
    parts = []
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        part = text[mark.end() : end].strip()
        if part:
            parts.append(part)
    return tuple(parts)


def read_file(path: Path) -> ReasoningLoad:
    load = ReasoningLoad()
    split = split_of(path)
    for n, (_number, where, row, problem) in enumerate(records(path)):
        if row is None:
            load.problems.append(f"{where}: skipped, {problem}")
            continue
        prompt, diagnosis = (
            str(row.get("case_prompt") or "").strip(),
            str(row.get("final_diagnosis") or "").strip(),
        )
        if not prompt or not diagnosis:
            load.problems.append(f"{where}: skipped, no {'case_prompt' if not prompt else 'final_diagnosis'}")
            continue
        pmcid = str(row.get("pmcid") or "").strip()
        local = pmcid or f"{path.stem}-{n:05d}"
        load.cases.append(
            ReasoningCase(
                _ID_UNSAFE.sub("-", local).strip("-")[:64],
                prompt,
                statements(str(row.get("diagnostic_reasoning") or "")),
                diagnosis,
                str(row.get("title") or ""),
                str(row.get("journal") or ""),
                pmcid,
                split,
            )
        )
    return load


def load_cases(paths: Iterable[Path]) -> ReasoningLoad:
    """Cases of files and directories; a directory's `data/` folder (a Hugging Face snapshot) counts too."""
    expanded: list[Path] = []
    for path in map(Path, paths):
        expanded.append(path)
        if path.is_dir() and (path / "data").is_dir():
            expanded.append(path / "data")
    return gather(expanded, SUFFIXES, read_file, "case-reasoning", ReasoningLoad())
