"""One bank row through the verl agent loop it names (verl's ToolAgentLoop, or an environment's own) with the
model's own tokenizer and template, no GPU.

What a model sees and what the reward reads depend on the chat template, not on case-env: a template without
a tool block never shows the tools, and one that renders tool results without `<tool_response>` markers
leaves the reward unable to tell tool output from the model's answer (docs/architecture.md, "The reward").
`case-env train preflight` therefore plays a short episode exactly as verl will: the row's prompt and its
offered tools rendered by verl's continuous-token builder for the model's type, a tool call written in the
run's `multi_turn.format` and parsed by verl's parser, a tool answer spliced in by verl (with an image when
the model is a VL one and the tool draws images: a VL model's rehearsal calls a drawing tool when the row
offers one), a final answer, and the response decoded as verl's reward manager decodes it. The tools are
stand-ins with the bank's schemas that answer a marker text, so no server is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from PIL import Image
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from case_env.core import registry
from case_env.core.calls import call_text
from case_env.core.parts import dialogue_of
from case_env.verl.dataset import CaseRLHFDataset, loop_class
from case_env.verl.model_files import ModelFiles
from case_env.verl.offline import ScriptedModel

TOOL_OUTPUT = "TOOL-OUTPUT-7f3a: the stand-in tool's answer"
FINAL = "The evidence is in.\n<answer>B</answer>"


@dataclass
class Rehearsed:
    """What verl rendered and decoded for one rehearsed episode."""

    tool: str
    prompt: str  # the first prompt, with special tokens
    prompt_after_tool: str  # the prompt of the second generation: the first turn, the tool's answer
    response: str  # the response as the reward manager decodes it (skip_special_tokens=True)
    image_pads: int  # image placeholder tokens in the second prompt
    executed: list[str] = field(default_factory=list)  # the stand-in tools that ran
    final: str = FINAL  # the final turn the rehearsal wrote
    renders_tools: bool = True  # the row's loop hands the tool schemas to the template
    image_sent: bool = False  # the called tool answered with an image


class StandIn(BaseTool):
    """A tool with a bank tool's schema that answers the marker text, and an image for a VL model."""

    def __init__(self, schema: dict, image: bool, executed: list[str]):
        super().__init__({"type": "native"}, OpenAIFunctionToolSchema.model_validate(schema))
        self.image = image
        self.executed = executed

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict, **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        self.executed.append(self.name)
        if self.image:
            return ToolResponse(text=TOOL_OUTPUT, image=[Image.new("RGB", (56, 56), (90, 90, 90))]), 0.0, {}
        return ToolResponse(text=TOOL_OUTPUT), 0.0, {}


def arguments_for(schema: dict) -> dict:
    """Values for a tool's required parameters: the first allowed value, else a placeholder of its type."""
    parameters = schema["function"].get("parameters") or {}
    properties = parameters.get("properties") or {}
    placeholders = {"integer": 1, "number": 1, "boolean": True}
    out = {}
    for name in parameters.get("required") or []:
        spec = properties.get(name) or {}
        out[name] = (spec.get("enum") or [None])[0] or placeholders.get(spec.get("type"), "preflight")
    return out


def rehearse(
    files: ModelFiles, config: Any, item: dict, schemas: list[dict], offered: list[dict]
) -> Rehearsed:
    """Play `item` (a row as CaseRLHFDataset yields it) under the composed verl `config`: one call of its
    first offered tool, then the final answer."""
    return asyncio.run(_rehearse(files, config, item, schemas, offered))


def draws(schema: dict) -> bool:
    """The tool answers with images (`ToolSpec.renders`)."""
    name = schema["function"]["name"]
    env = registry.for_tool(name)
    return env is not None and env.tools[name].renders


async def _rehearse(files: ModelFiles, config: Any, item: dict, schemas: list[dict], offered: list[dict]):
    executed: list[str] = []
    vision = files.processor is not None
    with contextlib.redirect_stdout(io.StringIO()):  # verl prints each tool schema as it builds a tool
        tools = [StandIn(schema, vision and draws(schema), executed) for schema in schemas]
    call = next((s for s in offered if draws(s)), offered[0]) if vision else offered[0]
    form = config.actor_rollout_ref.rollout.multi_turn.format
    agent = str(item.get("agent_name") or "tool_agent")
    dialogue = dialogue_of(registry.for_row(item["data_source"], item["extra_info"]), agent)
    # a loop of the environment's own ends on its own form (a dialogue answers plain text, <answer> included)
    final = f"{FINAL}\n{dialogue.closing}" if dialogue is not None else FINAL
    turns = [call_text(call["function"]["name"], arguments_for(call), form), final]
    model = ScriptedModel(files.tokenizer, lambda text, images, turn: turns[min(turn, len(turns) - 1)])
    loop = loop_class(agent)(
        trainer_config=DictConfigWrap(config),
        server_manager=model,
        tokenizer=files.tokenizer,
        processor=files.processor,
        dataset_cls=CaseRLHFDataset,
        data_config=DictConfigWrap(config.data),
        hf_model_type=files.model_type,
        tools=ToolListWrap(tools),
    )
    out = await loop.run(
        sampling_params={},
        raw_prompt=item["raw_prompt"],
        tools_kwargs=item["tools_kwargs"],
        extra_info=item["extra_info"],
        index=item["index"],
    )
    return Rehearsed(
        tool=call["function"]["name"],
        prompt=model.prompts[0],
        prompt_after_tool=model.prompts[1] if len(model.prompts) > 1 else "",
        response=files.tokenizer.decode(out.response_ids, skip_special_tokens=True),
        image_pads=model.image_pads[1] if len(model.image_pads) > 1 else 0,
        executed=executed,
        final=final,
        renders_tools=getattr(loop, "render_tools", True),
        image_sent=vision and draws(call),
    )
