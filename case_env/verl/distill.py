"""On-policy self-distillation from privileged context (OPSD) on verl 0.9.1's distillation path.

verl's agent loop worker asks its teacher for the log-probs of `prompt_ids + response_ids`, the student's own
sequence (`AgentLoopWorker._compute_teacher_logprobs`, docs/sources.md, verl 0.9.1). OPSD's teacher reads
more than the student: the row's prompt with `extra_info.teacher_insight` added (the teacher conditions on
privileged information, the student sees only the question, and the loss is taken per token over the
student's own rollout: "On-Policy Self-Distillation", UCLA/HKU/Meta, January 2026, docs/sources.md). Here:

- the privileged prompt is the row's messages with the insight appended to the last user message, under
  `HEADING`, tokenized by the same chat-template builder and with the same tool schemas as the student's
  prompt (checked: the student's prompt rebuilt the same way must equal the tokens it was sampled from);
- the teacher is sent the privileged prompt followed by the student's response tokens, tool turns included
  (verl masks tool tokens out of every loss through `response_mask`, which is not touched);
- its answer has `len(privileged) - len(prompt)` more positions than the student's sequence, all at the
  front: they are cut, so position i again scores the student's token i + 1 and verl pads, slices and
  applies its loss unchanged;
- a row without an insight, a validation rollout, a prompt that cannot be rebuilt, or a privileged sequence
  longer than the teacher serves falls back to verl's own behaviour (the plain prompt), logged.

Reached through verl's public extension point `actor_rollout_ref.rollout.agent.agent_loop_manager_class`
(`PrivilegedAgentLoops`, which builds verl's manager of either trainer with these workers); no verl code is
copied or patched. The teacher is any model verl serves as `distillation.teacher_models` (the launcher
serves the initial checkpoint: self-distillation).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.trainer.ppo.v1 import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

from case_env.verl.dataset import extra_info, offered_tools

INSIGHT = "teacher_insight"
HEADING = (
    "Verified notes on this case (what the evidence shows and why the answer follows). Reason and answer "
    "as if you had found this yourself:"
)
TEACHER_FIELDS = ("teacher_ids", "teacher_logprobs")
log = logging.getLogger(__name__)


def insight_of(sample: dict[str, Any]) -> str:
    """The row's privileged text (`extra_info.teacher_insight`, a dict or the bank's JSON text), "" when it has
    none."""
    value = extra_info(sample).get(INSIGHT)
    return value.strip() if isinstance(value, str) else ""


def privileged_messages(messages: list[dict], insight: str) -> list[dict]:
    """The row's messages with the insight after the last user message's text (a new text part when its
    content is a list of parts); the others unchanged. Where the student's question ends, so the teacher reads
    it as part of the question it answers."""
    out = [dict(m) for m in messages]
    last = max((i for i, m in enumerate(out) if m.get("role") == "user"), default=None)
    note = f"\n\n{HEADING}\n{insight}"
    if last is None:
        return [*out, {"role": "user", "content": note.lstrip()}]
    content = out[last].get("content")
    if isinstance(content, list):
        out[last]["content"] = [*content, {"type": "text", "text": note}]
    else:
        out[last]["content"] = f"{content or ''}{note}"
    return out


def prompt_images(messages: list[dict], images: list | None) -> list | None:
    """The images of the prompt itself: the first ones of the sample's images (tool images follow them)."""
    count = sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    )
    return list(images[:count]) if images and count else None


class PrivilegedTeacher:
    """Mixed into verl's agent loop workers: the teacher reads the privileged prompt (module docstring)."""

    async def _compute_teacher_logprobs(
        self,
        output: Any,
        prompt_ids: list[int],
        response_ids: list[int],
        validate: bool,
        sample_kwargs: dict[str, Any] | None = None,
    ) -> None:
        privileged = None
        if self.distillation_enabled and not validate:
            insight = insight_of(sample_kwargs or {})
            if insight:
                privileged = await self._privileged_prompt(
                    output, prompt_ids, response_ids, sample_kwargs, insight
                )
        if privileged is None:
            await super()._compute_teacher_logprobs(output, prompt_ids, response_ids, validate, sample_kwargs)
            return
        await super()._compute_teacher_logprobs(output, privileged, response_ids, validate, sample_kwargs)
        extra = len(privileged) - len(prompt_ids)
        for key in TEACHER_FIELDS:
            output.extra_fields[key] = output.extra_fields[key][extra:]

    async def _privileged_prompt(
        self, output: Any, prompt_ids: list[int], response_ids: list[int], sample: dict, insight: str
    ) -> list[int] | None:
        messages = list(sample.get("raw_prompt") or [])
        images = prompt_images(messages, (output.multi_modal_data or {}).get("images"))
        builder = self._prompt_builder()
        loop = asyncio.get_running_loop()

        def build(msgs: list[dict], schemas: list[dict]) -> list[int]:
            return list(builder.build_initial_tokens(msgs, tools=schemas, images=images))

        for schemas in self._offered_schemas(sample):
            plain = await loop.run_in_executor(None, build, messages, schemas)
            if plain != list(prompt_ids):
                continue
            privileged = await loop.run_in_executor(
                None, build, privileged_messages(messages, insight), schemas
            )
            if len(privileged) + len(response_ids) > self._teacher_tokens():
                return self._fell_back("the privileged sequence is longer than the teacher serves")
            return privileged
        return self._fell_back("the student's prompt could not be rebuilt with the row's tools or none")

    def _fell_back(self, reason: str) -> None:
        """Logged at the 1st, 10th, 100th ... time per reason and worker: a run where every row falls back
        says so without a line per sample."""
        counts = self.__dict__.setdefault("_plain_prompts", {})
        counts[reason] = counts.get(reason, 0) + 1
        if math.log10(counts[reason]).is_integer():
            log.warning(
                "OPSD: %s; the teacher read the plain prompt (%d time(s) here)", reason, counts[reason]
            )

    def _prompt_builder(self) -> Any:
        """verl's chat-template builder as the agent loops make it (AgentLoopBase.__init__), kept per worker."""
        builder = getattr(self, "_privileged_builder", None)
        if builder is None:
            builder = create_continuous_token_builder(
                self.tokenizer,
                hf_model_type=self.hf_model_type,
                chat_template_kwargs=self.config.data.get("apply_chat_template_kwargs", {}),
                mm_processor_kwargs=self.mm_processor_kwargs,
                processor=self.processor,
            )
            self._privileged_builder = builder
        return builder

    def _offered_schemas(self, sample: dict) -> list[list[dict]]:
        """The tool schemas a loop may have rendered: the row's (as verl's ToolAgentLoop offers them), or none
        (a loop that lists its tools in the system prompt)."""
        schemas = offered_tools(
            sample, [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in self.tools]
        )
        return [schemas, []] if schemas else [[]]

    def _teacher_tokens(self) -> int:
        """The longest sequence every teacher serves: its prompt length (the student's prompt and response
        plus what the launcher added for the insight) and its one generated token."""
        teachers = self.config.distillation.teacher_models.values()
        return min(int(t.inference.prompt_length) + int(t.inference.response_length) for t in teachers)


class PrivilegedAgentLoopWorker(PrivilegedTeacher, AgentLoopWorker):
    """verl's agent loop worker of the legacy trainer (`trainer.use_v1=False`) with a privileged teacher."""


class PrivilegedAgentLoopWorkerTQ(PrivilegedTeacher, AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's agent loop worker of the V1 trainer (TransferQueue, verl 0.9.1's default) with a privileged
    teacher."""


class _Manager(AgentLoopManager):
    def __init__(self, *args: Any, **kwargs: Any):
        self.agent_loop_workers_class = ray.remote(PrivilegedAgentLoopWorker)
        super().__init__(*args, **kwargs)


class _ManagerTQ(AgentLoopManagerTQ):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)  # sets verl's own worker class, which is replaced before any starts
        self.agent_loop_workers_class = ray.remote(PrivilegedAgentLoopWorkerTQ)


class PrivilegedAgentLoops:
    """`actor_rollout_ref.rollout.agent.agent_loop_manager_class`: verl's manager of the trainer the config
    runs (`trainer.use_v1`, true by default), its workers' teacher reading the privileged prompt."""

    @classmethod
    def create(cls, config: Any, **kwargs: Any) -> Any:
        manager = _ManagerTQ if config.trainer.get("use_v1", True) else _Manager
        return manager.create(config=config, **kwargs)
