"""Tool-capable chat templates for the model families the training docs name, shipped with the package.

verl renders a VL model's prompts with its *processor's* chat template and passes `tools=` to it; Qwen2.5-VL's
published processor template has no tool block, renders a tool message under its own role and no
`<tool_response>` markers, so the model never sees the tools and the reward cannot tell tool output from the
model's text (verl issues #2830, #4073; docs/sources.md, Chat templates). The launcher sets verl's
`actor_rollout_ref.model.custom_chat_template` to the family's template here when the model's own cannot
render tools (`case-env train preflight` says which it uses). One body (`qwen.jinja`) serves every family; a
family is that body with its switches set in front. `chatml` covers any other model whose vocabulary has the
ChatML turn tokens and whose own template renders no tools (SmolLM2's: `case-env model prepare`).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Family:
    """A model family: the verl `model_type`s it covers and how its template renders."""

    name: str
    model_types: tuple[str, ...]
    vision: bool
    thinking: bool
    default_system: str = ""
    call_format: str = "hermes"  # the tool-call form the template teaches; verl's parser must read it


FAMILIES = {
    f.name: f
    for f in (
        # Qwen2.5-VL's processor template opens with this system turn when a conversation has none
        Family("qwen2_5_vl", ("qwen2_5_vl", "qwen2_vl"), True, False, "You are a helpful assistant."),
        Family("qwen3_vl", ("qwen3_vl", "qwen3_vl_moe"), True, True),
        Family("qwen3", ("qwen3", "qwen3_moe"), False, True),
        Family("chatml", (), False, False),
    )
}
CHATML_TOKENS = frozenset({"<|im_start|>", "<|im_end|>"})
# Hugging Face ids name the family where no config.json is on the machine to read model_type from.
_NAME_PATTERNS = (
    ("qwen2_5_vl", re.compile(r"qwen2(\.5)?[-_]?vl", re.I)),
    ("qwen3_vl", re.compile(r"qwen3[-_]vl", re.I)),
    ("qwen3", re.compile(r"qwen3(?![.\d]|[-_]?coder)", re.I)),
)


def family_for(
    model_type: str | None, model_name: str = "", vocabulary: Collection[str] = ()
) -> Family | None:
    """The family of a model, by its config's `model_type`, else by its name, else `chatml` when its
    vocabulary has the ChatML turn tokens; None when case-env ships no template for it."""
    if model_type:
        family = next((f for f in FAMILIES.values() if model_type in f.model_types), None)
        if family is not None:
            return family
    else:
        for name, pattern in _NAME_PATTERNS:
            if pattern.search(model_name):
                return FAMILIES[name]
    return FAMILIES["chatml"] if set(vocabulary) >= CHATML_TOKENS else None


def template(family: Family) -> str:
    """The family's chat template, as verl's `custom_chat_template` takes it."""
    body = resources.files(__package__).joinpath("qwen.jinja").read_text(encoding="utf-8")
    switches = (
        f"{{%- set vision = {str(family.vision).lower()} -%}}"
        f"{{%- set thinking = {str(family.thinking).lower()} -%}}"
        f"{{%- set default_system = {family.default_system!r} -%}}"
    )
    return f"{{#- case-env chat template, family {family.name} -#}}{switches}{body}"
