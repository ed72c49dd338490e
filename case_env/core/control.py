"""Chat-template control strings made inert in text a tool answers with.

A tool answer becomes part of the model's context: verl renders it into the chat template and tokenizes the
result, and a tokenizer turns `<|im_start|>`, `<|im_end|>` or `</tool_response>` written as text into the
real control tokens (Qwen's vocabulary holds all of them). An answer that repeats what the model wrote, a
patient's reply from a language model or a report could then close the tool turn and forge others. Every
such string leaves the server with its `<` replaced by `‹` (U+2039): the text still reads, no tokenizer sees
a control token in it. Covered: every `<|...|>` token (Qwen, ChatML, Llama 3) and the tags of the tool-call
formats verl parses (`<tool_call>`, `<tool_response>`, `<think>`, qwen3_coder's `<function=`,
`<parameter=`), opening and closing.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(
    r"<(?=\|[^|<>\s]{1,40}\|>|/?(?:tool_call|tool_response|think|function|parameter)\b)", re.IGNORECASE
)
LOOKALIKE = "\u2039"


def inert(text: str) -> str:
    """`text` with every chat-template control string broken by a look-alike of its `<`."""
    if "<" not in text:  # the common case costs one scan
        return text
    return _CONTROL.sub(LOOKALIKE, text)


def excerpt(value: object, limit: int = 40) -> str:
    """A short, quoted excerpt of what a model sent, for a message that repeats it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-1]}"
