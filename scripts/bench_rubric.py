"""What CASE's rubric adds to the imaging reward: seconds per row of the letter's reward alone and with the
rubric's rules (weight 0: the judge is not asked), over trajectories `case-env eval` recorded, both timed in
this run; and one degenerate final turn citing 5,000 distinct values.

    case-env eval --bank BANK --agent scripted --out OUT && python scripts/bench_rubric.py OUT BANK
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from case_env.core.bank import load_items
from case_env.core.commands import run
from case_env.envs.imaging.reward import letter_score, rubric_score


def transcript(messages: list[dict]) -> str:
    """A recorded conversation as verl decodes it for the reward: turns, calls, tool responses."""
    parts = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if m["role"] == "assistant":
            calls = "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in m.get("tool_calls") or [])
            parts.append(content + calls)
        elif m["role"] == "tool":
            parts.append(f"user\n<tool_response>\n{content}\n</tool_response>")
    return "\n".join(parts)


async def per_row(score, rows: list[tuple], repeats: int) -> float:
    """Seconds per row of the coroutine `score`, all rows on one event loop."""
    began = time.perf_counter()
    for _ in range(repeats):
        for text, truth, extra in rows:
            await score(text, truth, extra)
    return (time.perf_counter() - began) / (repeats * len(rows))


async def letter_only(text: str, truth: str, _extra: dict):
    return letter_score(text, truth)


def main(
    trajectories: Annotated[Path, typer.Argument(help="An eval output directory (trajectories.jsonl).")],
    bank: Annotated[Path, typer.Argument(help="The bank it was run on.")],
    repeats: Annotated[int, typer.Option(help="Passes over the rows per timing.")] = 20,
) -> None:
    """Time the letter reward alone and with the rubric's rules."""
    extras = {item.key: item.extra for item in load_items(bank)}
    records = [json.loads(line) for line in (trajectories / "trajectories.jsonl").open()]
    rows = [(transcript(r["messages"]), r["ground_truth"], extras[r["question_id"]]) for r in records]
    letter = min(asyncio.run(per_row(letter_only, rows, repeats)) for _ in range(2))
    rubric = asyncio.run(per_row(rubric_score, rows, repeats))
    looping = rows[0][0] + "\n" + " ".join(f"{i}.{i % 10} mL" for i in range(5000))
    began = time.perf_counter()
    asyncio.run(rubric_score(looping, rows[0][1], rows[0][2]))
    print(
        json.dumps(
            {
                "rows": len(rows),
                "mean_chars": round(sum(len(r[0]) for r in rows) / len(rows)),
                "letter_us": round(letter * 1e6, 1),
                "letter_and_rubric_us": round(rubric * 1e6, 1),
                "ratio": round(rubric / letter, 1),
                "looping_5000_values_ms": round((time.perf_counter() - began) * 1e3, 1),
            }
        )
    )


if __name__ == "__main__":
    run(main)
