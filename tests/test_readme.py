"""The README a newcomer reads: short, free of development history, and every command and output it shows
is the real one (commands parsed by the real CLI, the serve example's answer computed on the demo's data)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import httpx
import pytest
import typer

from case_env.cli import app
from case_env.envs.imaging.synth.writer import generate_dataset
from case_env.verl import options
from tests.server_harness import live_server

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
USER_DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(text: str, language: str = "") -> list[str]:
    """The fenced blocks of one language ("": those without one), in order."""
    found, current, kind = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, kind = [], line[3:].strip()
            else:
                if kind == language:
                    found.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return found


def commands(block: str) -> list[list[str]]:
    """The block's commands, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def test_the_readme_reads_in_five_minutes_and_links_what_exists():
    assert len(README.splitlines()) < 250
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (REPO / target).exists(), target


@pytest.mark.parametrize("page", USER_DOCS, ids=lambda p: p.name)
def test_user_docs_carry_no_development_history(page):
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"\bissues? \d+\b|\(issue|this VM\b|tried on this", text, flags=re.I)
    # a commit named in user docs is an upstream one the sources were read at, never one of ours
    upstream = set(re.findall(r"\b[0-9a-f]{7}\b", (REPO / "docs" / "sources.md").read_text(encoding="utf-8")))
    assert set(re.findall(r"\bat ([0-9a-f]{7})\b", text)) <= upstream


def test_every_command_the_readme_shows_is_accepted_by_the_real_cli():
    root = typer.main.get_command(app)
    shown = [c for block in blocks(README, "bash") for c in commands(block)]
    checked = 0
    for command in shown:
        if command[0] == "case-env":
            words, node = command[1:], root
            while hasattr(node, "commands") and words and words[0] in node.commands:
                node, words = node.commands[words[0]], words[1:]
            node.make_context("case-env", list(words))  # raises on an unknown option or a bad value
            checked += 1
        elif command[0] == "scripts/train_grpo.sh":
            args, extra = options.parse(command[1:])
            assert args.dry_run and not extra
            checked += 1
        else:
            assert command[0] in ("make", "curl"), command
    assert checked >= 5


def test_the_serve_example_answers_what_the_readme_shows_on_the_demos_data(tmp_path):
    root = tmp_path / "synthetic"
    generate_dataset(root, 10, "ci", 0, jobs=2)  # make demo's data: 10 patients, ci profile, seed 0
    curl = next(c for block in blocks(README, "bash") for c in commands(block) if c[0] == "curl")
    url, body = curl[2], json.loads(curl[curl.index("-d") + 1])
    shown = next(
        json.loads(b.replace('"latency_ms":...', '"latency_ms":0'))
        for b in blocks(README)
        if '"ok":true' in b
    )
    with live_server(root, tmp_path) as live:
        answer = httpx.post(
            "http://" + url.replace("localhost:8000", live.url.removeprefix("http://")), json=body
        )
    answer = answer.json()
    assert {k: v for k, v in answer.items() if k != "latency_ms"} == {
        k: v for k, v in shown.items() if k != "latency_ms"
    }
