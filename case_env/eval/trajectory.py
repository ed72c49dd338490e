"""Trajectories in the CASE message format: one question instance per JSONL line with its whole conversation.

Messages follow the OpenAI chat schema (assistant `tool_calls`, `tool` replies whose content is a list of
text and image parts); images are written beside the file as `images/<caseNNNN>/img_*.png` and referenced by
relative path, so a directory of trajectories is self-contained and other tools' files of the same shape load.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from case_env.agents.base import Decision, ToolOutput
from case_env.eval.bank import Item

FILENAME = "trajectories.jsonl"


def case_folder(patient_id: str) -> str:
    digits = "".join(ch for ch in patient_id if ch.isdigit())
    return f"case{int(digits):04d}" if digits else patient_id


def to_record(item: Item, outputs: list[ToolOutput], decision: Decision, score: dict, out: Path,
              tools: list[dict]) -> dict:  # fmt: skip
    """Build the record and save its images under `out`."""
    extra = item.extra
    folder = case_folder(extra["patient_id"])
    messages: list[dict] = [dict(m) for m in item.prompt]
    images: list[str] = []
    for n, output in enumerate(outputs):
        call_id = f"call_{n}"
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": output.tool, "arguments": json.dumps(output.arguments, sort_keys=True)}}]})  # fmt: skip
        content: list[dict] = []
        if output.image is not None:
            relative = f"images/{folder}/img_{item.key}_{n:02d}.png"
            (out / relative).parent.mkdir(parents=True, exist_ok=True)
            if output.png is not None:
                (out / relative).write_bytes(output.png)
            else:
                output.image.save(out / relative)
            images.append(relative)
            content.append({"type": "image", "image": relative})
        content.append({"type": "text", "text": output.text})
        messages.append({"role": "tool", "tool_call_id": call_id, "name": output.tool, "content": content})
    final = f"{decision.reason}\n<answer>{decision.letter}</answer>"
    messages.append({"role": "assistant", "content": final})
    return {
        "id": item.key,
        "persona": _persona(item.data_source),
        "data_source": item.data_source,
        "case_id": folder,
        "patient_id": extra["patient_id"],
        "question_id": item.key,
        "template": extra.get("template"),
        "tools": tools,
        "messages": messages,
        "answer": decision.letter,
        "ground_truth": item.ground_truth,
        "answer_type": "mcq",
        "teacher_insight": extra.get("teacher_insight", ""),
        "images": images,
        "reward": score["score"],
        "format_ok": bool(score["format_ok"]),
        "tool_calls": len(outputs),
    }


def _persona(data_source: str) -> str:
    from case_env.personas import personas

    return next((name for name, p in personas().items() if p.data_source == data_source), "")


def read(path: Path) -> Iterator[dict]:
    """Records of a trajectory file; a torn last line (an interrupted run) is skipped."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def drop_torn_tail(path: Path) -> None:
    """Cut a last line left without its newline by an interrupted run, so appended records start clean."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])
