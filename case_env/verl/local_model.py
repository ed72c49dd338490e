"""verl's inference server, in this process: a model on this machine answers the agent loops' `generate`.

verl's agent loops (`ToolAgentLoop`, an environment's own loop, the OPSD worker's teacher) ask their server
manager for token ids: `generate(request_id, prompt_ids=..., sampling_params=...)` returning `TokenOutput`.
`LocalServer` is that manager over `case_env.lm.engine.Engine`, with vLLM's reading of the parameters as
verl 0.9.1's vLLM server applies them (docs/sources.md, verl 0.9.1): the turn's token budget is the run's
response length, capped by what is left of prompt plus response and by the model's context; the loop's stop
token ids end a turn; a request for prompt log-probs (the distillation teacher's) is answered in vLLM's
layout. Every turn it generated is kept by request id, so a run can report what the model wrote.
"""

from __future__ import annotations

from collections import defaultdict
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from verl.workers.rollout.replica import TokenOutput

from case_env.lm.engine import Completion, Engine, Sampling

# who asks: set by a caller playing many rows through one server, so their turns can be told apart
CALLER: ContextVar[Any] = ContextVar("case_env_caller", default=None)


@dataclass(frozen=True)
class GeneratedTurn:
    request_id: str  # verl's, which CaseTool makes the episode id
    prompt_tokens: int
    token_ids: list[int]
    finish: str
    cached_tokens: int


class LocalServer:
    """A verl server manager whose model runs here (images are refused: the model reads text only)."""

    def __init__(self, engine: Engine, *, prompt_length: int, response_length: int, seed: int | None = None):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.prompt_length, self.response_length, self.seed = prompt_length, response_length, seed
        self.model_type = engine.model.config.model_type
        self.turns: dict[Any, list[GeneratedTurn]] = defaultdict(list)  # by CALLER, else request id

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> TokenOutput:
        if image_data or video_data:
            raise ValueError(
                f"{self.engine.path.name} reads text only, and the turn holds images: serve its tools with "
                "CASE_ENV_TOOL_IMAGES=false, or use a vision-language model"
            )
        prompt = [int(t) for t in prompt_ids]
        if sampling_params.get("prompt_logprobs") is not None:
            return await self._prompt_logprobs(prompt)
        sampling = self.sampling(sampling_params, len(prompt))
        done: Completion = await self.engine.agenerate(prompt, sampling, key=request_id)
        caller = CALLER.get()
        turn = GeneratedTurn(request_id, len(prompt), done.token_ids, done.finish, done.cached_tokens)
        self.turns[request_id if caller is None else caller].append(turn)
        return TokenOutput(token_ids=done.token_ids, log_probs=done.logprobs, stop_reason="completed")

    def sampling(self, params: dict[str, Any], prompt_tokens: int) -> Sampling:
        """vLLM's parameters as verl's vLLM server sets them (`max_tokens` from the run's lengths)."""
        budget = params.get("max_tokens") or params.get("max_new_tokens")
        if budget is None:
            budget = min(self.response_length, self.prompt_length + self.response_length - prompt_tokens)
        budget = max(1, min(int(budget), self.engine.max_length - prompt_tokens))
        top_k = params.get("top_k")
        seed = params.get("seed", self.seed)
        return Sampling(
            max_tokens=budget,
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(top_k) if top_k is not None else -1,
            repetition_penalty=float(params.get("repetition_penalty", 1.0)),
            stop_ids=tuple(int(t) for t in params.get("stop_token_ids") or ()),
            seed=int(seed) if seed is not None else None,
        )

    async def _prompt_logprobs(self, sequence: list[int]) -> TokenOutput:
        """vLLM's prompt log-probs as verl's teacher reads them: position i scores token i + 1, the last
        position a placeholder."""
        import asyncio

        scores = await asyncio.wrap_future(self.engine.submit_scores(sequence))
        ids = [[t] for t in sequence[1:]] + [[0]]
        logprobs = [[s] for s in scores] + [[0.0]]
        return TokenOutput(token_ids=[0], extra_fields={"prompt_ids": ids, "prompt_logprobs": logprobs})
