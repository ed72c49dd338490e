"""`case-env eval`: roll a policy over a bank against a live server, for any environment.

The bank's rows name their environment, which supplies everything environment-specific: its scripted
baselines, how it rolls a row out (`variants`), the episode context its tools need, its reward and its
summary. This runner does the rest the same way for all of them: one rollout per (row, variant, repeat),
`concurrency` of them in flight, each call through the shared client (`case_env.core.client`) with the
episode's context, the calls as they ran handed to the reward as verl hands them, a progress bar, and one
trajectory record appended per finished rollout. The trajectory file is the run's only state: `--resume`
skips what it already holds, so an interrupted run continues without redoing work; without `--resume` an
existing file is never overwritten; results.json and report.html are always recomputed from it.
"""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
from PIL import Image
from tqdm import tqdm

from case_env.core import episode as episodes
from case_env.core import registry, trajectory
from case_env.core.bank import Item, load_items
from case_env.core.calls import FIELD, Call
from case_env.core.client import RetryPolicy, ToolClient
from case_env.core.environment import Environment
from case_env.core.parts import PolicyFactory, Variant, dialogue_of, evaluation_of
from case_env.core.policy import Observation, Turn
from case_env.eval.openai_agent import ModelSettings, OpenAIPolicy, chat_client
from case_env.eval.report import write_report

OPENAI = "openai"


def bank_environment(items: list[Item]) -> Environment:
    """The one environment a bank's rows belong to."""
    envs = {registry.for_row(item.data_source, item.extra).name for item in items}
    if len(envs) != 1:
        raise ValueError(
            f"the bank holds rows of {len(envs)} environments ({', '.join(sorted(envs))}); one is needed"
        )
    return registry.get(envs.pop())


def agents_of(env: Environment) -> tuple[str, ...]:
    return (*evaluation_of(env).baselines, OPENAI)


def samples_per_row(env: Environment, items: list[Item]) -> int:
    """How many independent samples the environment draws of each row."""
    return sum(v.sample is not None for v in evaluation_of(env).variants(items[0]))


def sample_temperature(env: Environment, model: ModelSettings) -> float:
    """The user's temperature, else the environment's for independent samples."""
    return evaluation_of(env).sample_temperature if model.temperature is None else model.temperature


def sampling(env: Environment, model: ModelSettings, variant: Variant, repeat: int, seed: int):
    """(temperature, request seed) of one rollout of the model: independent samples at the user's
    temperature or the environment's sample temperature, each with a seed of its own so it can be drawn
    again; every other rollout at the user's temperature or greedy."""
    if variant.sample is None:
        return (model.temperature or 0.0), model.seed
    temperature = sample_temperature(env, model)
    request_seed = seed * 1_000_003 + repeat * 1_000 + variant.sample if temperature > 0 else None
    return temperature, request_seed


def sampling_settings(
    env: Environment, items: list[Item], agent: str, model: ModelSettings | None, repeats: int, seed: int
) -> dict:
    """What results.json records beside pass@k: how the samples were drawn."""
    samples = samples_per_row(env, items)
    record: dict = {"samples_per_row": samples, "repeats": repeats, "seed": seed}
    if model is None:
        return {**record, "sampler": f"scripted agent {agent!r}, draws seeded by --seed"}
    sample_t = sample_temperature(env, model)
    return {
        **record,
        "sampler": "model",
        "sample_temperature": sample_t if samples else None,
        "temperature": model.temperature or 0.0,
        "max_tokens": model.max_tokens,
        "seeded_requests": bool(samples) and sample_t > 0,
    }


def check_sampling(env: Environment, items: list[Item], model: ModelSettings | None, greedy: bool) -> None:
    """Temperature 0 makes a row's independent samples one sample repeated: pass@k is then pass@1 for
    every k. Refused unless the user asks for it (`--greedy-samples`)."""
    if model is None or greedy or model.temperature is None or model.temperature > 0:
        return
    samples = samples_per_row(env, items)
    if samples > 1:
        raise ValueError(
            f"temperature 0 makes the {samples} independent samples of each {env.title} case identical, so "
            f"pass@k would equal pass@1 for every k: sample above 0 (the default is "
            f"{evaluation_of(env).sample_temperature}), or pass --greedy-samples to run them greedily anyway"
        )


def chosen_protocol(env: Environment, protocol: str | None) -> str:
    """The protocol asked for, else the environment's first; a name it does not have is refused."""
    protocols = evaluation_of(env).protocols
    if protocol is None:
        return protocols[0] if protocols else ""
    if protocol not in protocols:
        have = f"choose one of {', '.join(protocols)}" if protocols else "it has only one"
        raise ValueError(f"the {env.title} evaluation has no protocol {protocol!r}: {have}")
    return protocol


def _policies(
    env: Environment, agent: str, bank: Path, seed: int, model: ModelSettings | None, max_turns: int
):
    """(item, variant, tools, repeat) -> Policy, for a scripted baseline or the OpenAI-compatible agent."""
    if agent not in agents_of(env):
        raise ValueError(
            f"agent {agent!r} does not play a {env.title} bank; choose one of {', '.join(agents_of(env))}"
        )
    if agent != OPENAI:
        scripted: PolicyFactory = evaluation_of(env).policy_factory(agent, bank, seed)
        return lambda item, variant, _tools, repeat: scripted(item, variant, repeat)
    if model is None:
        raise ValueError("the openai agent needs --model-url and --model")
    client = chat_client(model)

    def make(item: Item, variant: Variant, tools: list[dict], repeat: int) -> OpenAIPolicy:
        turns = variant.max_turns or model.max_turns or max_turns
        temperature, request_seed = sampling(env, model, variant, repeat, seed)
        return OpenAIPolicy(
            variant.prompt or item.prompt, tools, model, client, turns, temperature, request_seed
        )

    return make


class _Rollouts:
    def __init__(
        self,
        env: Environment,
        client: ToolClient,
        schemas: dict[str, dict],
        pool: ThreadPoolExecutor,
        max_turns: int,
    ):
        self.env, self.client, self.schemas, self.pool, self.max_turns = env, client, schemas, pool, max_turns

    def tools_for(self, item: Item, variant: Variant) -> list[dict]:
        if not variant.tools:
            return []
        allowed = set(item.extra.get("tool_selection") or [])
        return [schema for name, schema in self.schemas.items() if not allowed or name in allowed]

    async def play(self, item: Item, variant: Variant, policy, tools: list[dict]) -> trajectory.Trajectory:
        loop = asyncio.get_running_loop()
        create = {
            **episodes.create_kwargs(item.extra),
            "patient_id": item.extra["patient_id"],
            **variant.create,
        }
        episode_id = f"eval-{uuid.uuid4().hex}"
        # a row whose loop is a dialogue is played as that loop plays it in training: every call of a turn
        # runs, the environment says when it ends, and (unless the variant says not) plain text is answered
        dialogue = dialogue_of(self.env, item.agent_name)
        listener = (dialogue.listener, dialogue.said) if dialogue is not None and variant.speak else None
        steps: list[Step] = []
        seen: list[Observation] = []
        calls: list[Call] = []
        offered = {t["function"]["name"] for t in tools}
        for _ in range(variant.max_turns or self.max_turns):
            turn = await loop.run_in_executor(self.pool, policy.next_turn, list(seen))
            step = Step(turn)
            steps.append(step)
            if dialogue is not None and dialogue.ends(turn.text):
                break
            if turn.final and listener is None:
                break
            if turn.final:
                step.said = True
                moves = [(listener[0], {listener[1]: turn.text})]
            else:
                moves = turn.calls if dialogue is not None else turn.calls[:1]  # tool_agent runs one call
            for name, arguments in moves:
                if tools and name not in offered and not step.said:
                    # a tool the row does not offer is refused before any call: in verl's words under
                    # tool_agent, in the environment's words under its own dialogue loop
                    refusal = (
                        dialogue.not_offered
                        if dialogue is not None
                        else f"Unknown function '{name}'. Available tools: {sorted(offered)}"
                    )
                    step.observations.append(Observation(name, arguments, refusal, None, None, False))
                    continue
                observation, call = await self._call(name, arguments, episode_id, create)
                step.observations.append(observation)
                calls.append(call)
            seen += step.observations
        extra = {**item.extra, **variant.extra, FIELD: [c.record() for c in calls]}
        score = (await self.env.score(transcript(steps), item.ground_truth, extra)).flat()
        prompt = variant.prompt or item.prompt
        messages = getattr(policy, "messages", None)
        if messages is None and dialogue is not None:  # several calls, or none, per turn: built here
            messages = dialogue_messages(prompt, steps)
        return trajectory.Trajectory(prompt, [s.turn for s in steps], seen, calls, score, tools, messages)

    async def _call(
        self, name: str, arguments: dict, episode_id: str, create: dict
    ) -> tuple[Observation, Call]:
        reply, call = await episodes.call(self.client, self.env, episode_id, create, name, arguments)
        if reply.http_status == 404:
            raise LookupError(
                f"the server has no case {create['patient_id']!r}: serve the bank's cases (case-env serve "
                f"--data-root holding them, or --cases {self.env.name}=FILE)"
            )
        pngs = reply.pngs()
        image = Image.open(io.BytesIO(pngs[0])).convert("RGB") if pngs else None
        observation = Observation(
            name, arguments, reply.model_text(), image, pngs[0] if pngs else None, reply.ok
        )
        return observation, call


@dataclass
class Step:
    """One assistant turn and what its calls (or, in a dialogue, its words) got back."""

    turn: Turn
    observations: list[Observation] = field(default_factory=list)
    said: bool = False  # its text went to the listener, whose reply is a user turn


def component_means(env: Environment, records: list[dict]) -> dict[str, float]:
    """Each component of the reward, its mean over the run's trajectories (what the score weighs)."""
    n = max(len(records), 1)
    return {
        c.name: round(sum(float(r["score"].get(c.name) or 0.0) for r in records) / n, 4)
        for c in env.components
    }


def transcript(steps: list[Step]) -> str:
    """An episode as verl decodes it for the reward: each turn, then its tool responses in one user turn, or
    the reply to its words as a user turn of its own."""
    parts = []
    for step in steps:
        parts.append(step.turn.written())
        if step.said:
            parts += [f"user\n{o.text}" for o in step.observations]
        elif step.observations:
            body = "\n".join(f"<tool_response>\n{o.text}\n</tool_response>" for o in step.observations)
            parts.append(f"user\n{body}")
    return "\n".join(parts)


def dialogue_messages(prompt: list[dict], steps: list[Step]) -> list[dict]:
    """A dialogue episode in the chat format: assistant turns with their calls, tool replies, the listener's
    replies as user turns."""
    messages = [dict(m) for m in prompt]
    for n, step in enumerate(steps):
        message: dict = {"role": "assistant", "content": step.turn.text}
        ids = [f"call_{n}_{i}" for i in range(len(step.turn.calls))]
        if step.turn.calls and not step.said:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": c[0], "arguments": json.dumps(c[1])}}
                for i, c in zip(ids, step.turn.calls, strict=True)
            ]
        messages.append(message)
        for i, observation in enumerate(step.observations):
            if step.said:
                messages.append({"role": "user", "content": observation.text})
            else:
                messages.append({"role": "tool", "tool_call_id": ids[i], "content": observation.text})
    return messages


def check_reachable(server_url: str, model: ModelSettings | None, timeout_s: float = 10.0) -> None:
    """Both ends answer HTTP (any status: a 401 or 404 still answers), else a ValueError naming the URL and
    the likely fix: an unreachable URL is the user's to fix, not a run's failure."""
    ends = [
        (
            f"{server_url.rstrip('/')}/healthz",
            f"no tool server answers at {server_url}",
            "start one with `case-env serve --data-root DIR` or pass its URL with --server",
        )
    ]
    if model is not None:
        ends.append(
            (
                f"{model.base_url.rstrip('/')}/models",
                f"no model server answers at {model.base_url}",
                "check --model-url (an OpenAI-compatible base URL, usually ending in /v1) or start the model's "
                "server (e.g. `transformers serve DIR`)",
            )
        )
    for url, problem, fix in ends:
        try:
            httpx.get(url, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise ValueError(f"{problem} ({type(exc).__name__}: {exc or 'no answer'}); {fix}") from None


def run_eval(
    bank: Path,
    server_url: str,
    agent: str,
    out: Path,
    concurrency: int = 4,
    limit: int | None = None,
    resume: bool = False,
    token: str | None = None,
    model: ModelSettings | None = None,
    repeats: int = 1,
    seed: int = 0,
    progress: bool = True,
    max_turns: int | None = None,
    greedy_samples: bool = False,
    protocol: str | None = None,
) -> dict:
    """Roll every row of the bank out `repeats` times (each of its environment's variants); the figures are
    means over all rollouts, so a stochastic agent's figure averages `repeats` draws per row."""
    items = load_items(bank)
    items = items[:limit] if limit else items
    if not items:
        raise ValueError(f"{bank} holds no rows")
    env = bank_environment(items)
    check_sampling(env, items, model, greedy_samples)
    evaluation = evaluation_of(env)
    protocol = chosen_protocol(env, protocol)
    budget = max_turns or evaluation.max_turns
    make_policy = _policies(env, agent, bank, seed, model, budget)
    check_reachable(server_url, model)  # after the arguments' checks, before anything is written
    out.mkdir(parents=True, exist_ok=True)
    path = out / trajectory.FILENAME
    if path.exists() and not resume:
        raise FileExistsError(f"{path} exists: pass --resume to continue that run, or choose another --out")
    trajectory.drop_torn_tail(path)
    done = {record["id"] for record in trajectory.read(path)}
    rollouts = [
        (item, variant, repeat)
        for item in items
        for repeat in range(repeats)
        for variant in evaluation.variants(item, protocol)
    ]
    keys = {trajectory.rollout_id(item, repeat, variant.name) for item, variant, repeat in rollouts}
    todo = [r for r in rollouts if trajectory.rollout_id(r[0], r[2], r[1].name) not in done]
    server_version = asyncio.run(
        _run(
            env,
            rollouts,
            todo,
            make_policy,
            server_url,
            token,
            concurrency,
            budget,
            out,
            path,
            agent,
            progress,
        )
    )
    records = [r for r in trajectory.read(path) if r["id"] in keys]
    results = {
        "env": env.name,
        "agent": agent,
        "bank": str(bank),
        "server_version": server_version,
        **({"protocol": protocol} if protocol else {}),
        "sampling": sampling_settings(env, items, agent, model, repeats, seed),
        **evaluation.summarise(records),
        "components": component_means(env, records),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_report(out, env, [(agent, results)], records)
    return results


async def _run(
    env, rollouts, todo, make_policy, server_url, token, concurrency, budget, out, path, agent, progress
) -> str:
    client = ToolClient(RetryPolicy(base_url=server_url, max_concurrency=concurrency), token=token or "")
    try:
        server_version = (await client.get("/healthz")).get("version", "")
        listed = await client.http.get("/v1/tools", params={"env": env.name})
        listed.raise_for_status()
        schemas = {t["name"]: t["schema"] for t in listed.json()["tools"]}
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="case-env-policy") as pool:
            runner = _Rollouts(env, client, schemas, pool, budget)
            gate = asyncio.Semaphore(concurrency)
            bar = tqdm(
                total=len(rollouts),
                initial=len(rollouts) - len(todo),
                desc=f"eval {agent}",
                disable=not progress,
            )

            async def one(item: Item, variant: Variant, repeat: int) -> None:
                async with gate:
                    tools = runner.tools_for(item, variant)
                    policy = await asyncio.get_running_loop().run_in_executor(
                        pool, make_policy, item, variant, tools, repeat
                    )
                    episode = await runner.play(item, variant, policy, tools)
                seen_as = replace(item, extra={**item.extra, **variant.extra})  # what the reward saw
                fields = evaluation_of(env).record_fields(seen_as)
                record = trajectory.to_record(item, env.name, episode, out, repeat, variant.name, fields)
                with path.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                bar.update()

            tasks = [asyncio.create_task(one(*r)) for r in todo]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                bar.close()
    finally:
        await client.aclose()
    return server_version
