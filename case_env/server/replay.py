"""Replay: serve recorded tool outputs instead of computing them (CASE trained RL against a tool-replay
environment). Users can run RL on recorded trajectories without the data behind them.

A call is keyed by (case, tool, canonical arguments); arguments are canonicalised by the tool's own argument
model, so defaults and spelling variants the live server accepts find the same recording. Argument validation
still runs first and fails exactly as it would live, since it needs no data. A call nobody recorded answers
`not_recorded` with text that says so.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from case_env.core import registry, trajectory
from case_env.core.calls import chat_call, written_calls
from case_env.core.sft_data import trajectory_files
from case_env.core.tools import (
    ErrorCode,
    ToolContext,
    ToolError,
    ToolImage,
    ToolResult,
    ToolSpec,
    canonical_arguments,
)
from case_env.core.trajectory import TrajectoryFormatError, content_parts

log = logging.getLogger("case_env.replay")
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)


@dataclass
class ReplayBook:
    entries: dict[tuple[str, str, str], ToolResult] = field(default_factory=dict)
    cases: dict[str, str] = field(default_factory=dict)  # case id -> its environment
    conflicts: int = 0

    @classmethod
    def load(cls, source: Path, tools: dict[str, ToolSpec]) -> ReplayBook:
        book = cls()
        for path in trajectory_files(source):
            for n, record in enumerate(trajectory.read(path), start=1):
                book._add_record(record, path.parent, tools, f"{path}:{n}")
        if book.conflicts:
            log.warning(
                "replay: %d recorded calls disagree with an earlier recording; the first is kept",
                book.conflicts,
            )
        return book

    def _add_record(self, record: dict, base: Path, tools: dict[str, ToolSpec], where: str) -> None:
        case_id = record.get("patient_id")
        if not case_id or not isinstance(record.get("messages"), list):
            raise TrajectoryFormatError(f"{where}: a replayable trajectory needs 'patient_id' and 'messages'")
        self.cases[case_id] = record.get("env") or registry.for_row(str(record.get("data_source", ""))).name
        pending: dict[str, tuple[str, dict]] = {}
        written: list[tuple[str, dict]] = []  # calls written in the text of the last assistant turn
        last: tuple[str, str, str] | None = None  # the entry of the latest tool reply
        for message in record["messages"]:
            role, content = message.get("role"), message.get("content")
            if role == "assistant" and not message.get("tool_calls"):
                written = (
                    written_calls(content, registry.tool_parameters()) if isinstance(content, str) else []
                )
            elif role == "user" and written and isinstance(content, str):
                # a model served without a tool parser: its calls in its text, their answers in one user turn
                for (name, arguments), text in zip(written, _RESPONSE.findall(content), strict=False):
                    last = self._add(case_id, tools.get(name), arguments, text, base, where)
                written = []
                continue
            for call in message.get("tool_calls") or []:
                pending[call.get("id", "")] = chat_call(
                    call
                )  # arguments None: malformed, never reached a tool
            if message.get("role") == "tool":
                name, arguments = pending.pop(message.get("tool_call_id", ""), (message.get("name"), None))
                last = self._add(
                    case_id, tools.get(name or ""), arguments, message.get("content"), base, where
                )
            elif message.get("role") == "user" and isinstance(message.get("content"), list) and last:
                # a chat transcript carries a tool's image in the user message right after the tool reply
                images = _result(message["content"], base, where).images
                if images and not self.entries[last].images:
                    self.entries[last] = dataclasses.replace(self.entries[last], images=images)
            if message.get("role") not in ("tool", "user"):
                last = None

    def _add(
        self, case_id: str, spec: ToolSpec | None, arguments: Any, content: Any, base: Path, where: str
    ) -> tuple[str, str, str] | None:
        """Record one call's answer; the entry's key, or None for a call no live server would have run."""
        if spec is None or arguments is None:
            return None  # an unknown tool or an orphan reply: nothing a live call could reach
        try:
            key = (case_id, spec.name, canonical_arguments(spec.parse(arguments)))
        except ToolError:
            return None  # a recorded invalid call: replay validates again and answers the same error
        result = _result(content, base, where)
        if key in self.entries and self.entries[key] != result:
            self.conflicts += 1
        self.entries.setdefault(key, result)
        return key

    def bind(self, tools: dict[str, ToolSpec]) -> dict[str, ToolSpec]:
        """The same tools (schemas, validation, pools) answering from this book (from memory: none awaits)."""
        return {
            name: dataclasses.replace(spec, run=self._handler(spec), awaits=False)
            for name, spec in tools.items()
        }

    def _handler(self, spec: ToolSpec):
        def run(ctx: ToolContext, args) -> ToolResult:
            key = (ctx.case_id, spec.name, canonical_arguments(args))  # already parsed by the route
            found = self.entries.get(key)
            if found is None:
                raise ToolError(
                    ErrorCode.NOT_RECORDED,
                    f"not recorded: this replay set holds no output of "
                    f"{spec.name} with these arguments for this case",
                )
            return found

        return run


def _result(content: Any, base: Path, where: str) -> ToolResult:
    texts, images = [], []
    for kind, value in content_parts(content, where):
        if kind == "text":
            texts.append(value)
            continue
        path = base / value
        if not path.is_file():
            raise TrajectoryFormatError(f"{where}: image {value!r} not found")
        png = path.read_bytes()
        with Image.open(path) as image:
            images.append(ToolImage(png, image.width, image.height))
    return ToolResult("\n".join(texts), tuple(images))
