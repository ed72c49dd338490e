"""CaseRLHFDataset: verl's RLHFDataset for the CASE schema, whose `extra_info` is a JSON string, measuring
each prompt as the rollout will render it.

verl 0.9.1's `RLHFDataset.__getitem__` reads `extra_info` with `.get`, so it only accepts a struct; the
CASE-Bench banks (and ours) store a JSON string, which also keeps Arrow from merging `tools_kwargs`
structs across rows. This subclass decodes the string on access.

verl's prompt-length filter (`filter_overlong_prompts`) renders every prompt with *every* tool of the tool
YAML, while `ToolAgentLoop` offers a row only its `extra_info.tool_selection`, in that order
(verl/utils/dataset/rl_dataset.py, experimental/agent_loop/tool_agent_loop.py; docs/sources.md, verl 0.9.1).
A MedExAgent-style row offers 9 of 69 tools, so verl measured 31,432 characters where the rollout renders 7,581, and
dropped every row of the bank at a 4,096-token limit. Here each row is measured as its agent loop renders
it: with the tools the rollout offers it, or none for a loop that renders no tool block (`RENDERS_TOOLS`
false: MedExAgent's); the rendering is otherwise verl's. Select it with
`data.custom_cls.path=<this file> data.custom_cls.name=CaseRLHFDataset`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from typing import Any

from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.tokenizer import build_multimodal_processor_inputs, normalize_token_ids

from case_env.core import registry
from case_env.core.environment import with_weights
from case_env.core.parts import Training


class _DecodedRows:
    """A view of a datasets.Dataset whose rows come back with `extra_info` decoded, and with the run's reward
    weights (`data.reward_weights`, a recipe's) over the row's own."""

    def __init__(self, dataframe: Any, weights: dict[str, float] | None = None):
        self._dataframe = dataframe
        self._weights = weights or {}

    def __len__(self) -> int:
        return len(self._dataframe)

    def __getitem__(self, item: Any) -> Any:
        row = self._dataframe[item]
        if isinstance(item, int) and isinstance(row.get("extra_info"), str):
            row["extra_info"] = json.loads(row["extra_info"])
        if isinstance(item, int) and self._weights and isinstance(row.get("extra_info"), dict):
            row["extra_info"] = with_weights(row["extra_info"], self._weights)
        return row

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dataframe, name)


def extra_info(row: dict) -> dict:
    extra = row.get("extra_info")
    extra = json.loads(extra) if isinstance(extra, str) else extra
    return extra if isinstance(extra, dict) else {}


def offered_tools(row: dict, schemas: list[dict]) -> list[dict]:
    """The schemas ToolAgentLoop offers a row (read or yielded): its `tool_selection` in that order (tools
    the YAML lacks left out), else every tool."""
    selection = extra_info(row).get("tool_selection")
    if not selection:
        return schemas
    by_name = {schema["function"]["name"]: schema for schema in schemas}
    return [by_name[name] for name in selection if name in by_name]


@functools.cache
def loop_class(agent_name: str) -> type:
    """The agent loop a row names: an environment's own (`Training.agent_loops`), else case-env's
    `tool_agent`."""
    from case_env.verl.loop import CaseToolAgentLoop

    for env in registry.environments().values():
        if isinstance(env, Training) and agent_name in env.agent_loops:
            module, _, name = env.agent_loops[agent_name].rpartition(".")
            return getattr(importlib.import_module(module), name)
    return CaseToolAgentLoop


def renders_tools(row: dict) -> bool:
    """Whether the row's agent loop renders a tool block into its prompt (as it is built by the launcher)."""
    return bool(getattr(loop_class(str(row.get("agent_name") or "tool_agent")), "RENDERS_TOOLS", True))


class CaseRLHFDataset(RLHFDataset):
    def _read_files_and_tokenize(self) -> None:
        super()._read_files_and_tokenize()
        weights = self.config.get("reward_weights") or {}
        self.dataframe = _DecodedRows(self.dataframe, {str(k): float(v) for k, v in weights.items()})

    def raw_rows(self) -> Any:
        """The rows as read from the files (extra_info still a JSON string), before any is yielded."""
        dataframe = self.dataframe
        return dataframe._dataframe if isinstance(dataframe, _DecodedRows) else dataframe

    def offered_tools(self, row: dict) -> list[dict] | None:
        """The tool schemas the rollout renders this row's prompt with (None: no tool block)."""
        if self.tool_schemas is None or not renders_tools(row):
            return None
        return offered_tools(row, self.tool_schemas)

    def prompt_tokens(self, row: dict) -> int:
        """The row's prompt length in tokens, rendered as RLHFDataset renders it, with the row's own tools."""
        kwargs = dict(self.apply_chat_template_kwargs)
        tools = self.offered_tools(row)
        if tools is not None:
            kwargs["tools"] = tools
        if self.processor is None:
            for key in ("tokenize", "return_dict", "return_tensors"):
                kwargs.pop(key, None)
            ids = self.tokenizer.apply_chat_template(
                row[self.prompt_key], add_generation_prompt=True, tokenize=True, **kwargs
            )
            return len(normalize_token_ids(ids))
        messages = self._build_messages(row, key=self.prompt_key)
        text = self.processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **kwargs
        )
        images, videos, audios = self._process_multi_modal_info(messages, self.image_patch_size, self.config)
        if images is None and videos is None and audios is None:
            encoded = self.processor.tokenizer(
                text=text, add_special_tokens=False, return_attention_mask=False
            )
            return len(encoded["input_ids"])
        inputs = build_multimodal_processor_inputs(
            self.processor,
            text=[text],
            images=images,
            videos=videos,
            audio=audios,
            mm_processor_kwargs=self.mm_processor_kwargs,
        )
        return len(inputs["input_ids"][0])

    def _filter_fingerprint(self, dataframe: Any, limit: int) -> str:
        """The filter's cache key from what decides a row's length: datasets would otherwise hash `fits` by
        pickling its closure, the tokenizer with it (about 6 s a dataset on a CPU, most of a preflight)."""
        tokenizer = self.processor or self.tokenizer
        inner = getattr(tokenizer, "tokenizer", tokenizer)
        parts = [
            getattr(dataframe, "_fingerprint", ""),
            limit,
            type(tokenizer).__name__,
            getattr(inner, "name_or_path", ""),
            len(inner) if hasattr(inner, "__len__") else 0,
            getattr(tokenizer, "chat_template", None) or getattr(inner, "chat_template", None),
            self.prompt_key,
            self.apply_chat_template_kwargs,
            self.tool_schemas,
            getattr(self, "image_patch_size", None),
            self.mm_processor_kwargs,
        ]
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def maybe_filter_out_long_prompts(self, dataframe: Any = None) -> Any:
        if not self.filter_overlong_prompts:
            return dataframe
        limit = self.max_prompt_length

        def fits(row: dict) -> bool:
            try:
                return self.prompt_tokens(row) <= limit
            except Exception as exc:  # verl drops a row it cannot render; `case-env train preflight` names it
                print(f"a row could not be rendered and is left out: {type(exc).__name__}: {exc}")
                return False

        kept = dataframe.filter(
            fits,
            num_proc=self.num_workers,
            desc=f"Filtering prompts longer than {limit} tokens (each with its own tools)",
            new_fingerprint=self._filter_fingerprint(dataframe, limit),
        )
        print(f"filter dataset len: {len(kept)}")
        return kept
