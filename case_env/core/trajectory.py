"""Trajectories in the CASE message format: one question instance per JSONL line with its whole conversation.

Messages follow the OpenAI chat schema (assistant `tool_calls`, `tool` replies whose content is a list of
text and image parts); images are written beside the file as `images/<caseNNNN>/img_*.png` and referenced by
relative path, so a directory of trajectories is self-contained and other tools' files of the same shape load.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from case_env.core import registry
from case_env.core.bank import Item
from case_env.core.calls import Call
from case_env.core.policy import Observation, Turn

FILENAME = "trajectories.jsonl"


def case_folder(case_id: str) -> str:
    digits = "".join(ch for ch in case_id if ch.isdigit())
    return f"case{int(digits):04d}" if digits else case_id


def rollout_id(item: Item, repeat: int, variant: str = "") -> str:
    """The record id of one rollout: the row's key, suffixed by its variant and, when a row is rolled out
    more than once, by the repeat."""
    key = f"{item.key}-{variant}" if variant else item.key
    return key if repeat == 0 else f"{key}-r{repeat}"


@dataclass
class Trajectory:
    """What one rollout did: its prompt, turns, what each call returned, the calls as they ran, the score."""

    prompt: list[dict]
    turns: list[Turn]
    observations: list[Observation]
    calls: list[Call]
    score: dict
    tools: list[dict]
    transcript: list[dict] | None = None  # a model's own chat messages, when it kept them

    @property
    def final(self) -> str:
        return self.turns[-1].text if self.turns and self.turns[-1].final else ""


def to_record(
    item: Item,
    env: str,
    episode: Trajectory,
    out: Path,
    repeat: int = 0,
    variant: str = "",
    fields: dict | None = None,
) -> dict:
    """Build the record and save its images under `out`. A model's own transcript (with image parts as data
    URLs) is kept as it was, malformed calls included; otherwise the conversation is built from the turns."""
    extra = item.extra
    folder = case_folder(extra["patient_id"])
    key = rollout_id(item, repeat, variant)
    if episode.transcript is not None:
        messages, images = _from_transcript(episode.transcript, key, folder, out)
    else:
        messages, images = _from_turns(episode.prompt, key, episode, folder, out)
        last = episode.turns[-1] if episode.turns and episode.turns[-1].final else None
        messages.append({"role": "assistant", "content": episode.final, **_reasoning(last)})
    score = episode.score
    return {
        "id": key,
        "repeat": repeat,
        "variant": variant,
        "env": env,
        "persona": _persona(item.data_source, extra),
        "data_source": item.data_source,
        "case_id": folder,
        "patient_id": extra["patient_id"],
        "question_id": item.key,
        "tools": episode.tools,
        "messages": messages,
        "answer": score["pred"],
        "ground_truth": item.ground_truth,
        "images": images,
        "reward": score["score"],
        "format_ok": bool(score["format_ok"]),
        "tool_calls": len(episode.observations),
        "turns": len(episode.turns),  # assistant turns (a turn may hold several calls, or none)
        "infra_errors": sum(c.infra_error for c in episode.calls),
        "score": score,
        **(fields or {}),
    }


def _save(out: Path, relative: str, png: bytes) -> None:
    (out / relative).parent.mkdir(parents=True, exist_ok=True)
    (out / relative).write_bytes(png)


def _from_transcript(
    transcript: list[dict], key: str, folder: str, out: Path
) -> tuple[list[dict], list[str]]:
    messages, images = [], []
    for message in transcript:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                url = (part.get("image_url") or {}).get("url", "") if part.get("type") == "image_url" else ""
                if url.startswith("data:image/png;base64,"):
                    relative = f"images/{folder}/img_{key}_{len(images):02d}.png"
                    _save(out, relative, base64.b64decode(url.split(",", 1)[1]))
                    images.append(relative)
                    parts.append({"type": "image", "image": relative})
                else:
                    parts.append(part)
            message = {**message, "content": parts}
        messages.append(message)
    return messages, images


def _reasoning(turn: Turn | None) -> dict:
    """A turn's separately returned reasoning, under the field name the chat APIs use."""
    return {"reasoning_content": turn.reasoning} if turn is not None and turn.reasoning else {}


def _from_turns(
    prompt: list[dict], key: str, episode: Trajectory, folder: str, out: Path
) -> tuple[list[dict], list[str]]:
    messages: list[dict] = [dict(m) for m in prompt]
    images: list[str] = []
    for n, (turn, output) in enumerate(zip(episode.turns, episode.observations, strict=False)):
        call_id = f"call_{n}"
        function = {"name": output.tool, "arguments": json.dumps(output.arguments, sort_keys=True)}
        messages.append(
            {
                "role": "assistant",
                "content": turn.text,
                **_reasoning(turn),
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        content: list[dict] = []
        if output.image is not None:
            relative = f"images/{folder}/img_{key}_{n:02d}.png"
            if output.png is None:
                buffer = io.BytesIO()
                output.image.save(buffer, format="PNG")
                output.png = buffer.getvalue()
            _save(out, relative, output.png)
            images.append(relative)
            content.append({"type": "image", "image": relative})
        content.append({"type": "text", "text": output.text})
        messages.append({"role": "tool", "tool_call_id": call_id, "name": output.tool, "content": content})
    return messages, images


def _persona(data_source: str, extra: dict) -> str:
    persona = registry.for_row(data_source, extra).personas.of(data_source)
    return persona.name if persona else ""


class TrajectoryFormatError(ValueError):
    """A trajectory line that is not a conversation this reader understands. A damaged line other than a torn
    last one is an error rather than skipped, because skipping it would silently lose a record."""


def content_parts(content: object, where: str) -> Iterator[tuple[str, str]]:
    """A message's content as ("text", text) and ("image", reference) pairs, in order: the one reading of the
    format that SFT export, replay and the report share. String content is a single text part; an image part
    may be `{"type": "image", "image": path}` or OpenAI's `{"type": "image_url", "image_url": {"url": ...}}`."""
    if content is None or isinstance(content, str):
        yield "text", content or ""
        return
    if not isinstance(content, list):
        raise TrajectoryFormatError(f"{where}: content must be a string or a list of parts")
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            yield "text", part.get("text", "")
        elif kind in ("image", "image_url"):
            yield "image", part.get("image") or (part.get("image_url") or {}).get("url", "")
        else:
            raise TrajectoryFormatError(f"{where}: unsupported content part type {kind!r}")


def read(path: Path) -> Iterator[dict]:
    """Records of a trajectory file. Only a last line without its newline (a run killed mid-write) is
    skipped; any other line that does not parse raises TrajectoryFormatError naming file and line."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                if not line.endswith("\n"):
                    return  # torn tail
                raise TrajectoryFormatError(f"{path}:{number}: not a JSON record ({exc.msg})") from None
            if not isinstance(record, dict):
                raise TrajectoryFormatError(f"{path}:{number}: a record must be a JSON object")
            yield record


def drop_torn_tail(path: Path) -> None:
    """Cut a last line left without its newline by an interrupted run, so appended records start clean."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])
