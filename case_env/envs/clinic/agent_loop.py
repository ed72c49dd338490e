"""MedExAgent's agent loop on verl 0.9.1: the doctor talks to the patient in plain text.

Written after MedExAgent's `MedicalAgentLoop` (`train/rl/agent_loop.py`; docs/sources.md, MedExAgent) on
verl's `ToolAgentLoop`, whose token building, masking and tool dispatch it keeps. verl 0.9.1 has no
Interaction, so the patient is the server's `ask_patient` tool, called with the doctor's words (scope, noise
and the episode log stay on the server; the call is recorded for the reward). Each turn, in MedExAgent's order:
1. a full token budget or the `max_assistant_turns`-th turn ends the episode;
2. `[DIAGNOSIS: ...]` in the turn ends it, tool calls or not;
3. tool calls all run, in order (more than one is a format error the reward reads from the text), their
   results in one user turn;
4. plain text goes to the patient, whose reply is a `user` message, unless `max_user_turns` user turns have
   passed (checked only here, as MedExAgent does).
An exam the row does not offer gets MedExAgent's "The requested exam is not available." without reaching the
server, and still counts for the reward. No tool block is rendered (the exams are in the system prompt, as
MedExAgent passes no schemas) unless the loop's config sets `render_tools: true`.
"""

from __future__ import annotations

import sys
from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState

from case_env.core import registry
from case_env.core.answers import final_segment
from case_env.core.parts import Training
from case_env.envs.clinic.bank import LOOP
from case_env.envs.clinic.context import MAX_TEXT
from case_env.verl.loop import CaseToolAgentLoop

_SPEAK = "_case_env_speak"  # the words of the last turn, kept on the agent data when they go to the patient


@register(LOOP)
class MedExAgentLoop(CaseToolAgentLoop):
    RENDERS_TOOLS = False  # the exam list is in the system prompt (what the length filter measures)

    def __init__(
        self, *args: Any, render_tools: bool = RENDERS_TOOLS, cut_replies: bool = False, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        # MedExAgent's loop hands the patient's reply over whole; `cut_replies: true` in the loop's entry of the
        # agent-loop file cuts it as verl cuts a tool's text (`max_tool_response_length`), for a tight budget
        self.cut_replies = cut_replies
        env = registry.get("clinic")
        assert isinstance(env, Training) and env.listener
        self.dialogue = env
        self.render_tools = render_tools
        # MedExAgent checks the user-turn limit only before the patient speaks, never after a generation
        self.patient_turn_limit, self.max_user_turns = self.max_user_turns, None
        self.max_parallel_calls = sys.maxsize  # every call of a turn runs

    async def _handle_pending_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any]
    ) -> AgentState:
        if not self.render_tools:
            agent_data._active_tool_schemas = []
        return await super()._handle_pending_state(agent_data, sampling_params)

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        before = len(agent_data.messages)
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        if len(agent_data.messages) == before:
            return state  # ended on the token budget or the assistant-turn limit, before the turn was read
        text = self.tokenizer.decode(agent_data.response_ids, skip_special_tokens=True)
        if self.dialogue.ends(text):
            return AgentState.TERMINATED
        if agent_data.tool_calls:
            return AgentState.PROCESSING_TOOLS
        if self.patient_turn_limit and agent_data.user_turns >= self.patient_turn_limit:
            return AgentState.TERMINATED
        setattr(agent_data, _SPEAK, text)
        return AgentState.PROCESSING_TOOLS

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        previous = list(agent_data.messages)
        words = getattr(agent_data, _SPEAK, None)
        if words is not None:
            setattr(agent_data, _SPEAK, None)
            reply = await self._say(agent_data, words)
            agent_data.messages.append({"role": "user", "content": reply})
        else:
            offered = getattr(agent_data, "_active_tools", self.tools)
            for call in agent_data.tool_calls:
                if call.name in offered:
                    response, reward, _ = await self._call_tool(call, agent_data.tools_kwargs, agent_data)
                    text = response.text or ""
                    if reward is not None:
                        agent_data.tool_rewards.append(reward)
                else:
                    text = self.dialogue.not_offered
                message = {"role": "tool", "content": text}
                if call.tool_call_id is not None:
                    message["tool_call_id"] = call.tool_call_id
                agent_data.messages.append(message)
        agent_data.user_turns += 1
        schemas = getattr(agent_data, "_active_tool_schemas", self.tool_schemas)
        merged, mask, logprobs = await self.ct_merge_context_msg(
            previous,
            agent_data.messages,
            agent_data.prompt_ids,
            agent_data.response_mask,
            agent_data.response_logprobs or None,
            tools=schemas,
        )
        if len(mask) >= self.response_length:
            return AgentState.TERMINATED
        agent_data.prompt_ids, agent_data.response_mask = merged.token_ids, mask
        if agent_data.response_logprobs:
            agent_data.response_logprobs = logprobs or []
        return AgentState.GENERATING

    async def _say(self, agent_data: AgentData, words: str) -> str:
        """The patient's reply to the doctor's words, from the server's `ask_patient` (the listener tool),
        which this loop calls whether or not the row offers it to the model."""
        name = self.dialogue.listener
        tool = self.tools[name]
        # a patient hears what the doctor says, not the doctor's <think> block; the words' tail is kept when
        # they run past what the server takes
        said = final_segment(words).strip()[-MAX_TEXT:] or "..."
        create = (agent_data.tools_kwargs.get(name) or {}).get("create_kwargs") or {}
        instance, _ = await tool.create(create_kwargs=create)
        try:
            response, _, _ = await tool.execute(instance, {self.dialogue.said: said}, agent_data=agent_data)
        finally:
            await tool.release(instance)
        return self._cut(response.text or "") if self.cut_replies else response.text or ""

    def _cut(self, text: str) -> str:
        """A reply cut to `max_tool_response_length` characters as verl's `_call_tool` cuts a tool's text
        (same side, same markers: verl 0.9.1, experimental/agent_loop/tool_agent_loop.py), since the reply
        does not pass through it."""
        limit = self.max_tool_response_length
        if len(text) <= limit:
            return text
        if self.tool_response_truncate_side == "left":
            return "(truncated)..." + text[-limit:]
        if self.tool_response_truncate_side == "right":
            return text[:limit] + "...(truncated)"
        half = limit // 2
        return text[:half] + "...(truncated)..." + text[-half:]
