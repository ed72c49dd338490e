"""Bank rows: one typed model for every environment's rows, splits by case, and the parquet files.

Columns are CASE's (the published CASE-Bench banks use the same): `data_source`, `prompt` (system and user
messages), `ability`, `reward_model {style, ground_truth}`, `extra_info` (a JSON string, which keeps Arrow
from merging `tools_kwargs` structs across rows; `CaseRLHFDataset` decodes it for verl) and `agent_name`.
`extra_info.env` names the environment that built the row: the registry routes reward, eval and
validation by it. Every row lists every tool of its environment in `tools_kwargs` with the same inner
keys: verl 0.9.1 fails a call whose tool entry came back as None after Arrow merged rows (docs/architecture.md).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from case_env.core.frozen import FrozenDraw
from case_env.core.problems import Problems

SPLITS = ("train", "val", "test")
AGENT_NAMES = ("tool_agent", "single_turn_agent")
REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name")
ARROW_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.string()),
        ("agent_name", pa.string()),
    ]
)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str
    content: str


class RewardSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    style: str = "rule"
    ground_truth: str = Field(min_length=1)


class ExtraInfo(BaseModel):
    """What every row's `extra_info` holds; an environment subclasses it with its own fields."""

    model_config = ConfigDict(extra="allow")

    env: str | None = Field(None, description="The environment that built the row (routes it).")
    index: int | None = None
    split: str | None = None
    patient_id: str  # the case's id, under the name CASE's schema gives it
    question_idx: int | None = None
    question: str
    ground_truth: str
    tools_kwargs: dict[str, dict[str, Any]]
    tool_selection: list[str]
    # what an environment whose rows carry it lists in `Banks.required_extra`: the privileged context a
    # teacher may read, and the calls that expose the answer (CASE's schema)
    teacher_insight: str | None = None
    evidence: list[Any] | None = None
    need_tools_kwargs: bool = True
    tool_schema_version: str | None = None

    @classmethod
    def for_case(
        cls,
        persona: Any,
        case_id: str,
        index: int,
        split: str,
        tools: Iterable[str],
        version: str,
        create: dict | None = None,
        tool_selection: list[str] | None = None,
        **fields: Any,
    ) -> Any:
        """The fields every row of a case fills the same way: its environment, index and split, the case as
        every tool's `create_kwargs` (with what the row adds), the persona's tools, the schema version."""
        return cls(
            env=persona.env,
            index=index,
            split=split,
            patient_id=case_id,
            question_idx=index,
            tools_kwargs=tools_kwargs(case_id, tools, **(create or {})),
            tool_selection=list(persona.tools) if tool_selection is None else tool_selection,
            tool_schema_version=version,
            **fields,
        )


REQUIRED_EXTRA = tuple(name for name, f in ExtraInfo.model_fields.items() if f.is_required())
CASE_EXTRA = (
    "question_idx",
    "teacher_insight",
    "evidence",
)  # CASE's schema, kept by environments that use it


class BankRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_source: str
    prompt: list[Message] = Field(min_length=1)
    ability: str
    reward_model: RewardSpec
    extra_info: ExtraInfo
    agent_name: str = "tool_agent"

    @classmethod
    def chat(
        cls,
        data_source: str,
        system: str,
        user: str,
        ability: str,
        extra: ExtraInfo,
        agent_name: str = "tool_agent",
    ) -> BankRow:
        """A row whose prompt is one system and one user message, keyed by the extra's ground truth."""
        prompt = [Message(role="system", content=system), Message(role="user", content=user)]
        return cls(
            data_source=data_source,
            prompt=prompt,
            ability=ability,
            extra_info=extra,
            agent_name=agent_name,
            reward_model=RewardSpec(ground_truth=extra.ground_truth),
        )

    def row(self) -> dict:
        """The parquet row: `extra_info` as a JSON string, every other column as its struct."""
        out = self.model_dump(mode="json", exclude={"extra_info"})
        out["extra_info"] = self.extra_info.model_dump_json(exclude_none=True)
        return out


def weigh_rows(result: BankResult, weights: dict[str, float]) -> None:
    """Give every row of a built bank these reward weights (`extra_info.reward_weights`), over its own."""
    from case_env.core.environment import with_weights  # the contract imports this module

    for rows in result.rows.values():
        for row in rows:
            row["extra_info"] = json.dumps(with_weights(json.loads(row["extra_info"]), weights))


def tools_kwargs(patient_id: str, tools: Iterable[str], **create: Any) -> dict[str, dict]:
    """Every tool of the environment with the same `create_kwargs` (the case, and what the row adds)."""
    return {name: {"create_kwargs": {"patient_id": patient_id, **create}} for name in tools}


@dataclass
class BankResult:
    rows: dict[str, list[dict]]
    cases: dict[str, list[str]]  # split -> its case ids
    skipped: Problems = field(default_factory=Problems)  # questions or cases left out, with the reason
    skipped_by_template: dict[str, dict[str, int]] = field(default_factory=dict)  # template -> reason -> n

    def counts(self) -> dict[str, Counter]:
        return {split: Counter(r["data_source"] for r in rows) for split, rows in self.rows.items()}


def split_cases(
    case_ids: list[str], fractions: tuple[float, float, float], seed: int
) -> dict[str, list[str]]:
    """Cases (never questions) go to splits; every split gets at least one case when there are three."""
    order = FrozenDraw(seed, "splits").shuffled(
        "patients", sorted(case_ids)
    )  # the draw's name fixes the splits
    n = len(order)
    sizes = [round(f * n) for f in fractions]
    if n >= 3:
        for i in range(3):
            if sizes[i] == 0 and fractions[i] > 0:
                sizes[i] = 1
        while sum(sizes) > n:
            sizes[sizes.index(max(sizes))] -= 1
    sizes[0] = n - sum(sizes[1:])
    out, start = {}, 0
    for split, size in zip(SPLITS, sizes, strict=True):
        out[split] = sorted(order[start : start + size])
        start += size
    return out


def rows_by_split(
    cases: list,
    fractions: tuple[float, float, float],
    seed: int,
    to_row: Callable[[Any, int, str], BankRow],
    given: Callable[[Any], str] | None = None,
) -> BankResult:
    """One row per case (anything with a `case_id`), cases split by id, indices in id order; `to_row(case,
    index, split)` makes the row. A case for which `given(case)` names a split (a published dataset's own)
    stays in it; the others are split by `fractions`. Environments with one row per case use this; those
    with several questions per case split cases themselves (`split_cases`)."""
    fixed = {c.case_id: given(c) for c in cases if given is not None and given(c) in SPLITS}
    ids = split_cases([c.case_id for c in cases if c.case_id not in fixed], fractions, seed)
    for case_id, split in sorted(fixed.items()):
        ids[split].append(case_id)
    ids = {split: sorted(members) for split, members in ids.items()}
    split_of = {cid: split for split, members in ids.items() for cid in members}
    rows: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for index, case in enumerate(sorted(cases, key=lambda c: c.case_id)):
        split = split_of[case.case_id]
        rows[split].append(to_row(case, index, split).row())
    return BankResult(rows, ids)


def write(result: BankResult, out: Path, meta: dict) -> None:
    """train/val/test parquet, one list of case ids per split (`<split>_patients.txt`, CASE's name), and bank.json with the counts and every row or
    question that was left out (the command line prints only the first of them)."""
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in result.rows.items():
        table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
        pq.write_table(table, out / f"{split}.parquet")
        (out / f"{split}_patients.txt").write_text(
            "".join(f"{p}\n" for p in result.cases[split]), encoding="utf-8"
        )
    summary = {
        **meta,
        "counts": {s: dict(c) for s, c in result.counts().items()},
        "patients": {s: len(p) for s, p in result.cases.items()},
        "skipped": result.skipped.to_json(),
    }
    if result.skipped_by_template:
        summary["skipped_by_template"] = result.skipped_by_template
    (out / "bank.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Item:
    """One row read back for evaluation; `key` is unique across the splits of a bank and names it in
    trajectories."""

    key: str
    data_source: str
    prompt: list[dict]
    ground_truth: str
    extra: dict
    agent_name: str = "tool_agent"  # the verl agent loop the row names


class BankError(ValueError):
    """A bank file that cannot be read, named with the fix."""


def read_bank(path: Path, columns: list[str] | None = None) -> pa.Table:
    """One bank file as a table: every command reads banks here, so a broken file is refused one way."""
    if not path.exists():
        raise FileNotFoundError(f"bank {path} does not exist")
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BankError(
            f"{path} is not a readable parquet file ({reason}); rebuild it with `case-env bank build` "
            "or copy it again"
        ) from None


def split_file(bank: Path, split: str) -> Path:
    """A split's file of a bank directory (a file is its own split), naming the splits there if absent."""
    if bank.is_file():
        return bank
    if not bank.exists():
        raise FileNotFoundError(f"bank {bank} does not exist (build one with `case-env bank build`)")
    path = bank / f"{split}.parquet"
    if path.is_file():
        return path
    have = [s for s in SPLITS if (bank / f"{s}.parquet").is_file()]
    if not have:
        raise FileNotFoundError(f"{bank} holds no split (build one with `case-env bank build --out {bank}`)")
    raise FileNotFoundError(f"{bank} has no split {split!r}; it has {', '.join(have)}")


def bank_files(bank: Path) -> list[Path]:
    """One parquet file, or every split of a bank directory."""
    if bank.is_dir():
        files = [bank / f"{split}.parquet" for split in SPLITS if (bank / f"{split}.parquet").exists()]
        if not files:
            raise FileNotFoundError(f"{bank} holds none of {', '.join(s + '.parquet' for s in SPLITS)}")
        return files
    if not bank.exists():
        raise FileNotFoundError(f"bank {bank} does not exist")
    return [bank]


def decode_extra(value: Any) -> dict:
    return json.loads(value) if isinstance(value, str) else dict(value)


def load_items(bank: Path) -> list[Item]:
    items = []
    for path in bank_files(bank):
        for row in read_bank(path).to_pylist():
            extra = decode_extra(row["extra_info"])
            split = extra.get("split", path.stem)
            items.append(
                Item(
                    key=f"{split}-{extra['question_idx']:05d}",
                    data_source=row["data_source"],
                    prompt=list(row["prompt"]),
                    ground_truth=row["reward_model"]["ground_truth"],
                    extra=extra,
                    agent_name=row.get("agent_name") or "tool_agent",
                )
            )
    return items


def reference_rows(bank: Path) -> list[dict]:
    """Rows a prompt-only prior may learn from: every split of the bank's directory (the prior leaves the
    asked-about patient out, so using all of them is fair), else the bank file itself."""
    folder = bank if bank.is_dir() else bank.parent
    has_splits = any((folder / f"{split}.parquet").exists() for split in SPLITS)
    return [item.extra for item in load_items(folder if has_splits else bank)]


def bank_sources(bank: Path) -> set[tuple[str | None, str]]:
    """(env, data_source) of every row, read from two columns only: what routes a bank to its environment."""
    out = set()
    for path in bank_files(bank):
        table = read_bank(path, columns=["data_source", "extra_info"])
        for source, extra in zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True):
            try:
                env = decode_extra(extra).get("env")
            except (ValueError, TypeError):
                env = None
            out.add((env, str(source)))
    return out
