"""`case-env bench model`: how fast a language model generates here, through case-env's engine (what
`rollouts --model` and the verl adapter use) against transformers' own `generate` (the floor every Hugging Face
path starts from), measured in one run on the same prompts.

Each round decodes `batch` sequences of `new_tokens` tokens after a prompt of `prompt_tokens` (random token
ids: the speed of a forward pass does not depend on which tokens they are), greedy, end tokens ignored so every
sequence runs to length, after an untimed round of each path. Reported per batch size: decode tokens per second of each path and their ratio,
prefill tokens per second, and the second-turn time of an episode whose first turn's cache the engine kept.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Round:
    batch: int
    engine_tokens_per_s: float
    transformers_tokens_per_s: float
    ratio: float


def _engine_round(engine, prompts: list[list[int]], new_tokens: int) -> float:
    from case_env.lm.engine import Sampling

    # end tokens ignored by asking for none: the prompt's ids avoid them, and max_tokens bounds the rest
    sampling = Sampling(max_tokens=new_tokens, temperature=0.0)
    before = engine.stats.generated
    started = time.perf_counter()
    futures = [engine.submit(p, sampling) for p in prompts]
    for f in futures:
        f.result()
    return (engine.stats.generated - before) / (time.perf_counter() - started)


def _transformers_round(model, prompts: list[list[int]], new_tokens: int) -> float:
    import torch

    ids = torch.tensor(prompts)
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
    return (out.shape[0] * (out.shape[1] - ids.shape[1])) / (time.perf_counter() - started)


def bench_model(
    model_dir: Path,
    out: Path,
    batches: tuple[int, ...] = (1, 4, 8),
    prompt_tokens: int = 512,
    new_tokens: int = 64,
) -> dict:
    import random

    import torch
    from transformers import AutoModelForCausalLM

    from case_env.lm.engine import Engine, Sampling

    engine = Engine(model_dir, max_batch=max(batches), window_s=0.05)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ends = engine.end_ids | {engine.tokenizer.pad_token_id}
    vocabulary = [t for t in range(1000, min(engine.model.config.vocab_size, 40_000)) if t not in ends]
    rng = random.Random(0)
    # one untimed round of each path first: the first forward pass pays for allocations and thread start-up
    warm = [[rng.choice(vocabulary) for _ in range(prompt_tokens)]]
    _engine_round(engine, warm, 4)
    _transformers_round(reference, warm, 4)
    rounds = []
    for batch in batches:
        prompts = [[rng.choice(vocabulary) for _ in range(prompt_tokens)] for _ in range(batch)]
        ours = _engine_round(engine, prompts, new_tokens)
        theirs = _transformers_round(reference, prompts, new_tokens)
        rounds.append(Round(batch, round(ours, 1), round(theirs, 1), round(ours / theirs, 2)))
    # prefill, and the second turn of an episode (its first turn's cache kept)
    prompt = [rng.choice(vocabulary) for _ in range(prompt_tokens)]
    started = time.perf_counter()
    first = engine.generate(prompt, Sampling(max_tokens=1, temperature=0.0), key="episode")
    prefill = prompt_tokens / (time.perf_counter() - started)
    follow = prompt + first.token_ids + [rng.choice(vocabulary) for _ in range(64)]
    started = time.perf_counter()
    engine.generate(follow, Sampling(max_tokens=1, temperature=0.0), key="episode")
    second_turn = time.perf_counter() - started
    started = time.perf_counter()
    engine.generate(follow, Sampling(max_tokens=1, temperature=0.0))
    second_turn_uncached = time.perf_counter() - started
    engine.close()
    result = {
        "model": str(model_dir),
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "threads": torch.get_num_threads(),
        "rounds": [asdict(r) for r in rounds],
        "prefill_tokens_per_s": round(prefill, 1),
        "second_turn_ms": {
            "cache_kept": round(second_turn * 1000, 1),
            "no_cache": round(second_turn_uncached * 1000, 1),
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def summary_lines(result: dict) -> list[str]:
    lines = [f"{'batch':>5s} {'engine tok/s':>13s} {'transformers tok/s':>19s} {'ratio':>6s}"]
    for r in result["rounds"]:
        lines.append(
            f"{r['batch']:5d} {r['engine_tokens_per_s']:13.1f} {r['transformers_tokens_per_s']:19.1f} "
            f"{r['ratio']:5.2f}x"
        )
    turn = result["second_turn_ms"]
    lines.append(
        f"prefill {result['prefill_tokens_per_s']:.0f} tok/s; an episode's second turn {turn['cache_kept']:.0f} ms "
        f"with its first turn's cache kept, {turn['no_cache']:.0f} ms without"
    )
    return lines
