"""Cases read from text files and held in memory, keyed by id: what environments with the `TextCases` part
share, and `TextCaseEnvironment`, the base of one with one bank row per case."""

from __future__ import annotations

import os
from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from case_env.core.bank import BankRow, rows_by_split
from case_env.core.environment import Environment
from case_env.core.errors import CommandError
from case_env.core.parts import BankBuild, BankOptions, Data, DataCheck, TextBankOptions
from case_env.core.problems import Problems
from case_env.core.tools import ToolContext
from case_env.settings import DataSettings


def case_paths(setting: str | None, data_root: Path | None, folder: str) -> list[Path]:
    """The case files a server loads: the setting's paths (separated by the path separator), else
    `<data root>/<folder>/` when it exists, else none."""
    paths = [Path(p) for p in setting.split(os.pathsep) if p] if setting else []
    if not paths and data_root is not None and (data_root / folder).is_dir():
        paths = [data_root / folder]
    return paths


class TextCases(Data):
    """Cases read from text files: `--cases NAME=PATH` and CASE_ENV_<NAME>_CASES for the server, `--cases` for
    a bank, else `<data root>/<name>/`. `load_cases(paths)` returns an object with `cases` (each with a
    `case_id`) and `problems` (rows that could not be read, with the reason)."""

    @abstractmethod
    def load_cases(self, paths: list[Path]) -> Any: ...

    def describe_cases(self, cases: list) -> tuple[dict[str, Any], str]:
        """Facts `data check` reports beside the count: (JSON summary, words after the count)."""
        return {}, ""

    def check_data(self, root: Path) -> DataCheck | None:
        return check_case_files(self, root)


@dataclass
class Loaded:
    """What `TextCases.load_cases` returns: the cases read (each with a `case_id`), and every row that could not
    be read, with the reason."""

    cases: list[Any]
    problems: list[str] = field(default_factory=list)


class CaseTable:
    """`Cases` of cases read once per worker (so their fingerprint never changes)."""

    def __init__(self, cases: list[Any], problems: list[str] | None = None):
        self.cases = {c.case_id: c for c in cases}
        self.problems = Problems(problems or [])

    def ids(self) -> list[str]:
        return sorted(self.cases)

    def __contains__(self, case_id: object) -> bool:
        return case_id in self.cases

    def fingerprint(self, case_id: str) -> tuple:
        return ()

    def warm(self, case_id: str) -> None:
        return None

    def memory_bytes(self) -> int:
        return 0


@dataclass
class CaseContext(ToolContext):
    """A tool's view of a case held in a `CaseTable`."""

    def case(self) -> Any:
        return self.cases.cases[self.case_id]


def check_case_files(env: TextCases, root: Path) -> DataCheck | None:
    """`data check` of an environment's case files under `<root>/<env>/`: the counts `describe_cases` gives,
    and every row that could not be read as a warning (None when the root has no such folder)."""
    name, title = env.name, env.title  # type: ignore[attr-defined]
    if not (root / name).is_dir():
        return None
    loaded = env.load_cases([root / name])
    facts, words = env.describe_cases(loaded.cases)
    summary = {"cases": len(loaded.cases), **facts, "problems": loaded.problems}
    line = f"{title} cases: {len(loaded.cases)}{words}"
    return DataCheck({name: summary}, [line], warnings=[f"{name}: {p}" for p in loaded.problems])


def load_text_cases(env: TextCases, options: TextBankOptions) -> tuple[list[Path], Any]:
    """(paths, loaded) of a text environment's bank: its --cases, else `<data root>/<environment>/`."""
    name = env.name  # type: ignore[attr-defined]
    paths = options.cases or ([options.data_root / name] if options.data_root is not None else [])
    if not paths:
        raise CommandError(f"a {name} bank needs --cases, or --data-root holding {name}/", 2)
    try:
        loaded = env.load_cases(paths)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CommandError(str(exc), 2) from None
    if not loaded.cases:
        raise CommandError(f"no usable {name} cases in {', '.join(map(str, paths))}")
    return paths, loaded


def cases_variable(name: str) -> str:
    """The environment variable naming a text environment's case files (`case-env serve --cases NAME=PATH`)."""
    return f"CASE_ENV_{name.upper()}_CASES"


def served_cases(env: TextCases, data_root: Path | None) -> CaseTable:
    """What a server worker holds of a text environment: CASE_ENV_<NAME>_CASES, else `<data root>/<name>/`."""
    name = env.name  # type: ignore[attr-defined]
    loaded = env.load_cases(case_paths(os.environ.get(cases_variable(name)), data_root, name))
    return CaseTable(loaded.cases, loaded.problems)


class TextCaseEnvironment(Environment, TextCases):
    """An environment of cases read from text files with one bank row per case. It writes `load_cases`,
    `case_row` and `score`; the server's table of cases, the tools' `CaseContext` (`ctx.case()`) and the bank's
    splits by case come from here."""

    bank_options: ClassVar[type[BankOptions]] = TextBankOptions

    def open_cases(self, data: DataSettings) -> CaseTable:
        return served_cases(self, data.data_root)

    def tool_context(self, cases: Any, case_id: str, episode: BaseModel | None) -> CaseContext:
        return CaseContext(cases, case_id, episode)

    @abstractmethod
    def case_row(self, case: Any, index: int, split: str) -> BankRow:
        """The bank row of one case (`index` its place in id order, `split` the split it went to)."""

    def build_bank(self, options: BankOptions) -> BankBuild:
        assert isinstance(options, TextBankOptions)
        paths, loaded = load_text_cases(self, options)
        result = rows_by_split(loaded.cases, options.split, options.seed, self.case_row)
        return BankBuild(
            result,
            {"cases": [str(p) for p in paths]},
            [f"{len(loaded.cases)} cases"],
            Problems(loaded.problems),
        )
