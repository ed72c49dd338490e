"""Tagged blocks of model text (`<answer>...</answer>`, `<tool_call>`, `[TAG: ...]`), found in one pass.

A policy in RL can loop on a tag for its whole response. A regex of the form `<a>(.*?)</a>` tries every
opening tag against the rest of the text when the closing one never comes, which is quadratic: `<tool_call>`
18,000 times took 41.7 s to score, and held the server's event loop as long. `Tagged` finds each
block with `str.find`, moving only forward, and keeps the regex's meaning, which every reward relies on: a
block ends at the nearest closing tag, blocks never overlap, and where asked an unclosed block runs to the end
of the text (as `(?:</a>|$)` does, stopping before a final newline). It answers the calls the readers made of
the compiled patterns (`finditer`, `findall`, `search`, `sub`, `split`), so they read the same results; the
tests check both against the regexes they replace.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_SPACE = re.compile(r"\s*")


@dataclass(frozen=True, slots=True)
class TagMatch:
    """One block: where it starts and ends, and where its content does (group 1)."""

    text: str
    begin: int
    finish: int
    content_begin: int
    content_finish: int

    def start(self) -> int:
        return self.begin

    def end(self) -> int:
        return self.finish

    def group(self, index: int = 0) -> str:
        if index == 0:
            return self.text[self.begin : self.finish]
        if index == 1:
            return self.text[self.content_begin : self.content_finish]
        raise IndexError(f"no group {index}")


class Tagged:
    """Blocks `opening ... closing`: the linear counterpart of `re.compile(opening + r"(.*?)" + closing,
    re.DOTALL)`.

    `to_end`: an unclosed block runs to the end of the text (`(?:closing|$)`). `ignore_case`: the opening tag
    in any case. `skip_space` and `nonempty`: the content starts after the whitespace following the opening
    tag and holds at least one character (`opening\\s*(.+?)closing`, as MedExAgent's answer tag is read)."""

    def __init__(
        self,
        opening: str,
        closing: str,
        *,
        to_end: bool = False,
        ignore_case: bool = False,
        skip_space: bool = False,
        nonempty: bool = False,
    ):
        self.opening, self.closing = opening, closing
        self.to_end, self.skip_space, self.nonempty = to_end, skip_space, nonempty
        self._opening = re.compile(re.escape(opening), re.IGNORECASE) if ignore_case else None

    def _open(self, text: str, pos: int) -> tuple[int, int]:
        """(start, end) of the next opening tag at or after `pos`; (-1, -1) when there is none."""
        if self._opening is None:
            at = text.find(self.opening, pos)
            return (at, at + len(self.opening)) if at >= 0 else (-1, -1)
        found = self._opening.search(text, pos)
        return found.span() if found is not None else (-1, -1)

    def finditer(self, text: str) -> Iterator[TagMatch]:
        pos, size = 0, len(text)
        while True:
            begin, after = self._open(text, pos)
            if begin < 0:
                return
            content = _SPACE.match(text, after).end() if self.skip_space else after
            close = text.find(self.closing, content + 1 if self.nonempty else content)
            if close < 0 and self.nonempty and content > after and text.startswith(self.closing, content):
                # the regex gives the last whitespace character back to the content: `[X:  ]` reads " "
                content, close = content - 1, content
            if close < 0:
                if not self.to_end:
                    return  # no closing tag after this one, so none after any later opening tag either
                finish = size - 1 if text.endswith("\n") and content < size else size
                yield TagMatch(text, begin, finish, content, finish)
                return
            yield TagMatch(text, begin, close + len(self.closing), content, close)
            pos = close + len(self.closing)

    def findall(self, text: str) -> list[str]:
        """The contents of every block."""
        return [match.group(1) for match in self.finditer(text)]

    def search(self, text: str) -> TagMatch | None:
        return next(self.finditer(text), None)

    def split(self, text: str) -> list[str]:
        """The text between blocks (the blocks left out)."""
        pieces, pos = [], 0
        for match in self.finditer(text):
            pieces.append(text[pos : match.begin])
            pos = match.finish
        pieces.append(text[pos:])
        return pieces

    def sub(self, replacement: str, text: str) -> str:
        """Every block replaced by `replacement` (a plain string)."""
        return replacement.join(self.split(text))
