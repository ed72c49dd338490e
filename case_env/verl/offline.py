"""verl 0.9.1's real ToolAgentLoop on CPU, without a GPU or model weights.

An offline byte-level tokenizer with a hermes-style chat template, an offline Qwen2-VL processor (image
preprocessing only), and a scripted model standing in for the inference server: each `generate` call is
answered by a policy that sees the prompt text and the images so far. Used by `make demo` (rollouts of a
scripted policy) and by the contract tests. Technique after docs/sources.md, verl 0.9.1; written for
this project.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.workers.rollout.replica import TokenOutput

from case_env.verl.dataset import CaseRLHFDataset, loop_class
from case_env.verl.launch import PARALLEL_CALLS
from case_env.verl.model_files import NoVideo, allow_no_video

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Added tokens that decoding keeps even with skip_special_tokens=True, as in Qwen2.5/Qwen3's tokenizer_config
# ("special": false for ids 151657-151668), so verl's reward manager sees the tool calls a model wrote.
TEXT_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# A hermes-style template: tools listed in the system turn, tool calls as <tool_call>{json}</tool_call>,
# tool results as <tool_response> blocks in a user turn, images as vision placeholders.
TEMPLATE = r"""
{%- macro body(content) -%}
{%- if content is string -%}{{ content }}{%- else -%}{%- for part in content -%}
{%- if part.type == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>{%- elif part.type == 'text' -%}{{ part.text }}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ body(messages[0].content) }}{% else %}You are a helpful assistant.{% endif %}
{%- if tools %}

Available tools:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}Call a tool by writing <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
{%- endif %}<|im_end|>
{% for m in messages if m.role != 'system' -%}
{%- if m.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' %}<|im_start|>user
{% endif -%}
<tool_response>
{{ body(m.content) }}
</tool_response>
{%- if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>
{% endif -%}
{%- else -%}
<|im_start|>{{ m.role }}
{{ body(m.content) if m.content else '' }}
{%- for call in (m.tool_calls or []) %}{% set f = call.function if call.function is defined else call %}<tool_call>
{"name": "{{ f.name }}", "arguments": {{ f.arguments if f.arguments is string else (f.arguments | tojson) }}}
</tool_call>{% endfor %}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level, no merges: every byte is one token, so any text round-trips; Qwen-named specials."""
    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS,
    )
    tokenizer.add_tokens(TEXT_TOKENS, special_tokens=False)
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def build_processor(tokenizer: PreTrainedTokenizerFast):
    """Qwen2-VL's PIL image processor around our tokenizer. The video slot gets a stand-in, because the real
    video processor needs torchvision (not installed on CPU); no test sends video."""
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor

    allow_no_video()
    tokenizer.image_token = "<|image_pad|>"
    tokenizer.video_token = "<|video_pad|>"
    return Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(),
        tokenizer=tokenizer,
        video_processor=NoVideo(),
        chat_template=TEMPLATE,
    )


Policy = Callable[[str, list, int], str]  # (prompt text so far, images so far, turn) -> next assistant turn


class ScriptedModel:
    """Stands in for verl's LLM server: each generate() returns the policy's next assistant turn."""

    def __init__(self, tokenizer, policy: Policy):
        self.tokenizer = tokenizer
        self.policy = policy
        self.prompts: list[str] = []
        self.images: list[int] = []
        self.image_pads: list[int] = []
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")

    async def generate(
        self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None, **kw
    ):
        text = self.tokenizer.decode(prompt_ids)
        self.prompts.append(text)
        self.images.append(len(image_data or []))
        self.image_pads.append(list(prompt_ids).count(self.pad))
        turn = self.policy(text, list(image_data or []), len(self.prompts) - 1)
        ids = [*self.tokenizer.encode(turn, add_special_tokens=False), self.end]
        return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids), stop_reason="completed")


def loop_config(
    max_turns: int = 8,
    response_length: int = 32768,
    tool_text: int = 2048,
    form: str = "hermes",
    parallel_calls: int = PARALLEL_CALLS,
):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 16384,
                    "response_length": response_length,
                    "full_determinism": False,
                    "multi_turn": {
                        "enable": True,
                        "max_assistant_turns": max_turns,
                        "max_user_turns": None,
                        "max_parallel_calls": parallel_calls,
                        "max_tool_response_length": tool_text,
                        "tool_response_truncate_side": "middle",
                        "format": form,
                    },
                }
            },
            "data": {"apply_chat_template_kwargs": {}, "mm_processor_kwargs": {}},
        }
    )


def make_loop(
    tools: list, model: Any, processor=None, config=None, agent_name: str = "tool_agent"
) -> ToolAgentLoop:
    """`model` answers `generate` as verl's server manager does (`ScriptedModel`, `LocalServer`). Must run
    inside the event loop that will drive it (AgentLoopBase captures the running loop)."""
    config = config or loop_config()
    text_type = getattr(model, "model_type", None) or "qwen2"
    return loop_class(agent_name)(
        trainer_config=DictConfigWrap(config),
        server_manager=model,
        tokenizer=model.tokenizer,
        processor=processor,
        dataset_cls=CaseRLHFDataset,
        data_config=DictConfigWrap(config.data),
        hf_model_type="qwen2_vl" if processor is not None else text_type,
        tools=ToolListWrap(tools),
    )


async def run_row(loop: ToolAgentLoop, item: dict, sampling_params: dict | None = None):
    """One dataset row (as RLHFDataset yields it) through the loop, with the columns verl passes."""
    return await loop.run(
        sampling_params=dict(sampling_params or {}),
        raw_prompt=item["raw_prompt"],
        tools_kwargs=item["tools_kwargs"],
        extra_info=item["extra_info"],
        index=item["index"],
    )


async def score_with_verl(tokenizer, outputs: list, items: list[dict]) -> list[dict]:
    """Score finished trajectories the way a verl job does: custom reward loaded by verl's loader, run by
    verl's NaiveRewardManager. Must run inside the event loop (the manager captures it)."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    import case_env.reward

    config = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": case_env.reward.__file__, "name": "compute_score"}}}
    )
    manager = NaiveRewardManager(config, tokenizer, get_custom_reward_fn(config))
    results = []
    for out, item in zip(outputs, items, strict=True):
        response = torch.tensor([out.response_ids])
        prompt = torch.tensor([out.prompt_ids])
        mask = torch.ones(1, prompt.shape[1] + response.shape[1], dtype=torch.long)
        data = DataProto.from_dict(
            tensors={"responses": response, "prompts": prompt, "attention_mask": mask},
            non_tensors={
                "data_source": np.array([item["data_source"]], dtype=object),
                "reward_model": np.array([item["reward_model"]], dtype=object),
                "extra_info": np.array([item["extra_info"]], dtype=object),
                "tool_extra_fields": np.array([out.extra_fields], dtype=object),
            },
        )
        results.append(await manager.run_single(data))
    return results
