"""Model directories with Qwen's real vocabulary, built offline, for the training preflight's tests.

No model can be downloaded here, but Qwen's byte-level BPE ranks ship inside the `dashscope` package on PyPI
(`dashscope/resources/qwen.tiktoken`, Apache-2.0; docs/sources.md, Qwen vocabulary): Qwen2, Qwen2.5 and Qwen3
share those 151,643 tokens, with the control tokens at the ids their tokenizer_config.json gives. Converted by
transformers' own TikTokenConverter, prompts are measured in the tokens a Qwen model counts, and special
tokens decode as verl's reward manager decodes them. A directory holds what verl loads from a checkpoint:
tokenizer files, config.json, the image processor's config and the processor's chat template.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
from pathlib import Path

# Qwen2's pre-tokenizer pattern (the one `qwen.tiktoken` was trained with)
PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# ids 151643-151668 in order: special (stripped when decoding with skip_special_tokens) or not
CONTROL = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# Behaves as Qwen2.5-VL's published processor template (chat_template.json): vision placeholders, a default
# system turn, every message under its own role, and no tools at all (verl issues #2830, #4073).
STOCK_QWEN2_5_VL = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' "
    "in content %}{% set image_count.value = image_count.value + 1 %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vocabulary() -> Path:
    spec = importlib.util.find_spec("dashscope")
    assert spec is not None and spec.submodule_search_locations, "dashscope (a dev dependency) is missing"
    return Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"


@functools.cache
def _tokenizer_json() -> str:
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    core = TikTokenConverter(
        vocab_file=str(vocabulary()), pattern=PATTERN, extra_special_tokens=[]
    ).converted()
    for token, special in CONTROL:
        added = AddedToken(token, special=special, normalized=False)
        (core.add_special_tokens if special else core.add_tokens)([added])
    return core.to_str()


def model_dir(
    out: Path, model_type: str, template: str | None = None, processor_template: str | None = None
) -> Path:
    """A checkpoint directory without weights: Qwen's tokenizer with `template` in tokenizer_config.json and,
    for a VL `model_type`, Qwen2-VL's image processor with `processor_template` in chat_template.json (the
    files a Hugging Face snapshot of a Qwen-VL model holds)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    specials = [token for token, special in CONTROL if special]
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": specials[3:],
        "model_max_length": 131072,
        **({"chat_template": template} if template is not None else {}),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    model = {"model_type": model_type, "transformers_version": "5.0.0"}
    (out / "config.json").write_text(json.dumps(model), encoding="utf-8")
    if processor_template is not None:
        from transformers import Qwen2VLImageProcessorPil

        Qwen2VLImageProcessorPil().save_pretrained(out)
        (out / "chat_template.json").write_text(
            json.dumps({"chat_template": processor_template}), encoding="utf-8"
        )
    return out
