"""Trajectories as training data: CASE-format trajectory files to verl's multi-turn SFT parquet.

verl 0.9.1's MultiTurnSFTDataset reads a `messages` column (string contents, images as `<image>`
placeholders filled in order from an `images` column) and a `tools` column handed to the chat template. It
decodes no JSON, so tool-call arguments are kept as JSON strings (the Qwen templates print a string as is) and
tool schemas as nested lists of structs. Any JSONL whose lines carry `messages` (and optionally `tools`) in the
OpenAI chat shape reads here, whoever wrote it; image parts name files relative to that JSONL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from case_env.core import trajectory
from case_env.core.policy import with_thought
from case_env.core.trajectory import TrajectoryFormatError


def trajectory_files(source: Path) -> list[Path]:
    if source.is_dir():
        # eval runs name theirs trajectories.jsonl (a run folder also holds other JSONL, e.g. audit logs);
        # a folder written by another tool may name them anything
        files = sorted(source.rglob(trajectory.FILENAME)) or sorted(source.rglob("*.jsonl"))
        if not files:
            raise FileNotFoundError(f"no .jsonl trajectory files under {source}")
        return files
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    return [source]


def _flatten(message: dict, base: Path, where: str) -> tuple[dict, list[dict]]:
    """One message with string content and its images, in order."""
    images: list[dict] = []
    pieces = []
    for kind, value in trajectory.content_parts(message.get("content"), where):
        if kind == "image":
            path = base / value
            if not path.is_file():
                raise TrajectoryFormatError(f"{where}: image {value!r} not found beside the trajectory file")
            images.append({"bytes": path.read_bytes()})
            value = "<image>"
        pieces.append(value)
    # a reasoning model's trace, returned apart by its server, trains inside <think> as it was written
    content = with_thought("\n".join(pieces), message.get("reasoning_content"))
    out = {"role": message["role"], "content": content}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": call.get("id", ""),
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": _as_json(call["function"]["arguments"]),
                },
            }
            for call in message["tool_calls"]
        ]
    return out, images


def _as_json(arguments: str | dict) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)


def sft_rows(source: Path, correct_only: bool = True) -> Iterator[dict]:
    for path in trajectory_files(source):
        for n, record in enumerate(trajectory.read(path), start=1):
            where = f"{path}:{n}"
            if not isinstance(record.get("messages"), list) or not record["messages"]:
                raise TrajectoryFormatError(f"{where}: no 'messages' list")
            if correct_only and record.get("reward", 0) < 1:
                continue
            messages, images = [], []
            for message in record["messages"]:
                flat, found = _flatten(message, path.parent, where)
                messages.append(flat)
                images += found
            yield {
                "messages": messages,
                "tools": record.get("tools") or [],
                "images": images,
                "data_source": record.get("data_source", ""),
                "id": str(record.get("id", where)),
            }


def write_sft(source: Path, out: Path, correct_only: bool = True) -> int:
    rows = list(sft_rows(source, correct_only))
    if not rows:
        raise ValueError(f"no {'correct ' if correct_only else ''}trajectories in {source}")
    if not any(row["images"] for row in rows):
        for row in rows:  # verl demands a processor whenever the column exists, even empty
            del row["images"]
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return len(rows)
