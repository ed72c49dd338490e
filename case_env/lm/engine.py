"""A Hugging Face causal language model generating token ids for many callers at once, on the CPU.

verl's agent loops ask an inference server for each assistant turn as token ids (vLLM's `generate`); this is
such a server inside the process, for a model small enough to run here. Decoding is bound by memory traffic,
so: requests that arrive together are decoded as one batch; the key-value cache grows in place rather than
being copied at every token (transformers' dynamic cache concatenates); attention reads the shared key-value
heads of grouped-query attention without repeating them (transformers' SDPA path copies them whenever there is
a padding mask). Decoding a batch runs at 0.85-1.02x transformers' own `generate` (`case-env bench model`,
docs/models.md): what the engine is kept for is what `generate` lacks. The cache of each request is kept after
its turn under the caller's key, so the next turn of the same episode, its prompt extended by the tool's
answer, computes only the new tokens (an episode's second turn: 526 against 1,817 ms, the same page);
requests from many episodes join a batch at any time; log-probabilities are those of the raw logits, as vLLM
returns them by default.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "case_env_grouped"


def grouped_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **_):
    """Attention with each shared key-value head read once by its group of query heads; `attention_mask` is
    SDPA's boolean mask (True: attend), or None for plain causal attention."""
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, groups * length, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * (scaling if scaling is not None else dim**-0.5)
    if attention_mask is None and length > 1:
        offset = key.shape[2] - length
        attention_mask = torch.ones(length, key.shape[2], dtype=torch.bool).tril(offset)[None, None]
    if attention_mask is not None:
        keep = attention_mask.expand(batch, 1, length, key.shape[2]).repeat(1, 1, groups, 1)
        # a finite floor, not -inf: a fully masked row (a padded position) stays finite
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    out = torch.matmul(torch.softmax(scores, -1), value).reshape(batch, heads, length, dim)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, grouped_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


class _GrowingLayer(DynamicLayer):
    """A dynamic cache layer written into spare capacity (doubled when full), not concatenated per token."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._keys = self._values = None
            self._length = 0
        end = self._length + key_states.shape[-2]
        if self._keys is None or end > self._keys.shape[-2]:
            capacity = max(2 * end, 64)
            keys = key_states.new_zeros(*key_states.shape[:2], capacity, key_states.shape[-1])
            values = torch.zeros_like(keys)
            if self._keys is not None:
                keys[:, :, : self._length] = self._keys[:, :, : self._length]
                values[:, :, : self._length] = self._values[:, :, : self._length]
            self._keys, self._values = keys, values
        self._keys[:, :, self._length : end] = key_states
        self._values[:, :, self._length : end] = value_states
        self._length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values


def _cache(layers: int, content: list | None = None) -> DynamicCache:
    """A cache of growing layers, holding `content` ((keys, values) per layer) when given."""
    cache = DynamicCache()
    cache.layers = [_GrowingLayer() for _ in range(layers)]
    for i, (keys, values) in enumerate(content or ()):
        cache.layers[i].update(keys, values)
    return cache


@dataclass(frozen=True)
class Sampling:
    """How one completion is drawn; temperature 0 is greedy. The end tokens of the model always stop it."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    stop_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class Completion:
    token_ids: list[int]  # the stop token included, as vLLM returns it
    logprobs: list[float]
    finish: str  # "stop" (an end or stop token) or "length"
    cached_tokens: int  # prompt tokens whose cache an earlier turn left


@dataclass
class Stats:
    """What the engine did since it started: the figures `case-env bench model` reports."""

    requests: int = 0
    batches: int = 0
    generated: int = 0
    prefilled: int = 0
    reused: int = 0
    busy_s: float = 0.0


@dataclass
class _Job:
    key: str | None
    prompt: list[int]
    sampling: Sampling | None  # None: the prompt's log-probs
    future: Future = field(default_factory=Future)


@dataclass
class _Prefix:
    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


@dataclass
class _Row:
    job: _Job
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # (1, heads, length, dim) per layer
    logits: torch.Tensor
    cached: int
    budget: int
    generator: torch.Generator
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""


class Engine:
    """The model behind a queue: `submit` from any thread, `agenerate` from any event loop."""

    def __init__(
        self,
        path: Path | str,
        *,
        max_batch: int = 8,
        window_s: float = 0.02,
        cache_bytes: int = 2 << 30,
        seed: int = 0,
        model: Any = None,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = Path(path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = (
            model
            or AutoModelForCausalLM.from_pretrained(
                self.path, dtype=torch.float32, attn_implementation=ATTENTION
            )
        ).eval()
        config = self.model.config
        self.max_length = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        ends = self.model.generation_config.eos_token_id
        ends = ends if isinstance(ends, list) else [ends]
        self.end_ids = frozenset(i for i in [*ends, self.tokenizer.eos_token_id] if i is not None)
        self.max_batch, self.window_s, self.cache_bytes = max_batch, window_s, cache_bytes
        self.stats = Stats()
        self._seeds = torch.Generator().manual_seed(seed)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._prefixes: OrderedDict[str, _Prefix] = OrderedDict()
        self._prefix_bytes = 0
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    # -- callers ----------------------------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], sampling: Sampling, key: str | None = None) -> Future:
        """A completion of `prompt_ids`; `key` names the episode whose earlier turns' cache may be reused."""
        if not prompt_ids or not all(isinstance(t, int) for t in prompt_ids):
            raise ValueError("a prompt is a non-empty list of token ids (ints)")
        if len(prompt_ids) >= self.max_length:
            raise ValueError(
                f"a prompt of {len(prompt_ids)} tokens leaves no room in the model's {self.max_length}"
            )
        return self._put(_Job(key, list(prompt_ids), sampling))

    def submit_scores(self, ids: list[int]) -> Future:
        """The log-probability of each token of `ids` after those before it (len(ids) - 1 values)."""
        return self._put(_Job(None, list(ids), None))

    async def agenerate(
        self, prompt_ids: list[int], sampling: Sampling, key: str | None = None
    ) -> Completion:
        return await asyncio.wrap_future(self.submit(prompt_ids, sampling, key))

    def generate(self, prompt_ids: list[int], sampling: Sampling, key: str | None = None) -> Completion:
        return self.submit(prompt_ids, sampling, key).result()

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _put(self, job: _Job) -> Future:
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="case-env-lm", daemon=True)
                self._thread.start()
        self._jobs.put(job)
        return job.future

    # -- the worker thread ------------------------------------------------------------------------------

    def _serve(self) -> None:
        while (first := self._jobs.get()) is not None:
            jobs, closing = self._gather(first)
            started = time.monotonic()
            for group in [[j] for j in jobs if j.sampling is None] + [[j for j in jobs if j.sampling]]:
                if group:
                    self._run(group)
            self.stats.busy_s += time.monotonic() - started
            if closing:
                return

    def _gather(self, first: _Job) -> tuple[list[_Job], bool]:
        """The first job and those arriving within the window, up to a batch."""
        jobs, deadline = [first], time.monotonic() + self.window_s
        while len(jobs) < self.max_batch:
            try:
                job = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
        return jobs, False

    def _run(self, jobs: list[_Job]) -> None:
        try:
            with torch.inference_mode():
                results = [self._score(jobs[0].prompt)] if jobs[0].sampling is None else self._decode(jobs)
        except Exception as exc:  # the callers see the model's failure; the engine serves on
            for job in jobs:
                job.future.set_exception(exc)
            return
        for job, result in zip(jobs, results, strict=True):
            job.future.set_result(result)

    def _score(self, ids: list[int]) -> list[float]:
        logits = self.model(input_ids=torch.tensor([ids])).logits[0, :-1]
        logprobs = torch.log_softmax(logits.float(), -1)
        return logprobs.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()

    def _prefill(self, job: _Job) -> _Row:
        assert job.sampling is not None
        prefix, start = self._reuse(job.key, job.prompt)
        cache = _cache(self.model.config.num_hidden_layers, prefix)
        out = self.model(
            input_ids=torch.tensor([job.prompt[start:]]),
            position_ids=torch.arange(start, len(job.prompt)).unsqueeze(0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.stats.prefilled += len(job.prompt) - start
        self.stats.reused += start
        seed = job.sampling.seed
        generator = torch.Generator().manual_seed(
            seed if seed is not None else int(torch.randint(1 << 62, (1,), generator=self._seeds))
        )
        layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        budget = min(job.sampling.max_tokens, self.max_length - len(job.prompt))
        return _Row(job, layers, out.logits[0, -1], start, max(1, budget), generator)

    def _decode(self, jobs: list[_Job]) -> list[Completion]:
        """Prefill each prompt past its cached prefix, then decode all of them as one left-padded batch."""
        rows = [self._prefill(job) for job in jobs]
        lengths = [len(r.job.prompt) for r in rows]
        width = max(lengths)
        layers = [
            tuple(torch.cat([_left_pad(r.layers[i][kv], width) for r in rows]) for kv in (0, 1))
            for i in range(len(rows[0].layers))
        ]
        cache = _cache(len(layers), layers)
        mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
        valid = mask.bool().clone()  # the positions each row's kept cache holds
        positions = torch.tensor([[n] for n in lengths])
        logits = torch.stack([r.logits for r in rows])
        while True:
            tokens = self._sample(logits, rows)
            active = [not r.finish for r in rows]
            if not any(active):
                break
            # a finished row goes on attending to its own junk, so no query is fully masked (NaN in SDPA)
            feed = torch.tensor([[t] for t in tokens])
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], 1)
            valid = torch.cat([valid, torch.tensor([[a] for a in active])], 1)
            out = self.model(
                input_ids=feed,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            positions = positions + 1
            logits = out.logits[:, -1]
        self.stats.batches += 1
        self.stats.requests += len(rows)
        self.stats.generated += sum(len(r.out) for r in rows)
        self._keep(rows, cache, valid)
        return [Completion(r.out, r.logprobs, r.finish, r.cached) for r in rows]

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> list[int]:
        """The next token of every row (a finished row's is a placeholder), recorded with its raw log-prob."""
        raw = torch.log_softmax(logits.float(), -1)
        tokens = []
        for b, row in enumerate(rows):
            if row.finish:
                tokens.append(row.out[-1])
                continue
            s = row.job.sampling
            assert s is not None
            token = _draw(logits[b].float(), s, row.job.prompt + row.out, row.generator)
            row.out.append(token)
            row.logprobs.append(float(raw[b, token]))
            if token in self.end_ids or token in s.stop_ids:
                row.finish = "stop"
            elif len(row.out) >= row.budget:
                row.finish = "length"
            tokens.append(token)
        return tokens

    # -- kept caches ------------------------------------------------------------------------------------

    def _reuse(self, key: str | None, prompt: list[int]) -> tuple[list | None, int]:
        """The cache an earlier turn of `key` left for the longest shared prefix (one token is always
        computed, for its logits)."""
        entry = self._prefixes.pop(key, None) if key is not None else None
        if entry is None:
            return None, 0
        self._prefix_bytes -= entry.nbytes
        shared = 0
        for a, b in zip(entry.ids, prompt, strict=False):
            if a != b:
                break
            shared += 1
        shared = min(shared, len(prompt) - 1)
        if shared <= 0:
            return None, 0
        return [(k[:, :, :shared], v[:, :, :shared]) for k, v in entry.layers], shared

    def _keep(self, rows: list[_Row], cache: Any, valid: torch.Tensor) -> None:
        for b, row in enumerate(rows):
            if row.job.key is None:
                continue
            where = valid[b].nonzero().squeeze(1)
            layers = [
                (layer.keys[b : b + 1, :, where].clone(), layer.values[b : b + 1, :, where].clone())
                for layer in cache.layers
            ]
            entry = _Prefix(row.job.prompt + row.out[:-1], layers)
            self._prefixes[row.job.key] = entry
            self._prefix_bytes += entry.nbytes
        while self._prefix_bytes > self.cache_bytes and self._prefixes:
            _key, old = self._prefixes.popitem(last=False)
            self._prefix_bytes -= old.nbytes


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - tensor.shape[2]
    if not missing:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([pad, tensor], 2)


def _draw(logits: torch.Tensor, s: Sampling, seen: list[int], generator: torch.Generator) -> int:
    if s.repetition_penalty != 1.0:  # CTRL's penalty, as vLLM and transformers apply it
        index = torch.tensor(sorted(set(seen)))
        picked = logits[index]
        logits = logits.clone()
        logits[index] = torch.where(picked > 0, picked / s.repetition_penalty, picked * s.repetition_penalty)
    if s.temperature <= 0:
        return int(logits.argmax())
    logits = logits / s.temperature
    if 0 < s.top_k < logits.shape[0]:
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        mass = torch.softmax(ordered, -1).cumsum(-1)
        drop = mass - torch.softmax(ordered, -1) > s.top_p  # keep the smallest set reaching top_p
        logits = logits.scatter(0, order[drop], float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
