"""Read the rows an evaluation runs over: one parquet file, or every split of a bank directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Item:
    """One question instance; `key` is unique across the splits of a bank and names it in trajectories."""

    key: str
    data_source: str
    prompt: list[dict]
    ground_truth: str
    extra: dict


def bank_files(bank: Path) -> list[Path]:
    if bank.is_dir():
        files = [bank / f"{split}.parquet" for split in SPLITS if (bank / f"{split}.parquet").exists()]
        if not files:
            raise FileNotFoundError(f"{bank} holds none of {', '.join(s + '.parquet' for s in SPLITS)}")
        return files
    if not bank.exists():
        raise FileNotFoundError(f"bank {bank} does not exist")
    return [bank]


def load_items(bank: Path) -> list[Item]:
    items = []
    for path in bank_files(bank):
        for row in pq.read_table(path).to_pylist():
            extra = row["extra_info"]
            extra = json.loads(extra) if isinstance(extra, str) else dict(extra)
            split = extra.get("split", path.stem)
            items.append(Item(key=f"{split}-{extra['question_idx']:05d}", data_source=row["data_source"],
                              prompt=list(row["prompt"]), ground_truth=row["reward_model"]["ground_truth"],
                              extra=extra))  # fmt: skip
    return items


def reference_rows(bank: Path) -> list[dict]:
    """Rows a prompt-only prior may learn from: every split of the bank's directory (the prior leaves the
    asked-about patient out, so using all of them is fair), else the bank file itself."""
    folder = bank if bank.is_dir() else bank.parent
    has_splits = any((folder / f"{split}.parquet").exists() for split in SPLITS)
    return [item.extra for item in load_items(folder if has_splits else bank)]
