"""The checks of `case-env train preflight`, each a function of the composed run that returns one `Check`.

Each names what a first GPU run would otherwise meet only after it started, or never notice: a template that
hides the tools, prompts verl would drop, a server the workers of another node cannot reach, a run that
saves nothing, a missing inference engine, episodes that share one id. The orchestration and the table are
in `case_env/verl/preflight.py`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import math
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from omegaconf import OmegaConf

from case_env.core.answers import final_segment
from case_env.server.control import only_here
from case_env.verl.cluster import NodeReport
from case_env.verl.dataset import offered_tools
from case_env.verl.model_files import ModelFiles
from case_env.verl.rehearsal import TOOL_OUTPUT, rehearse

PASS, FAIL, UNVERIFIED, SKIPPED = "pass", "FAIL", "unverified", "skipped"
# what makes the template's prompt teach a parser's call form (verl's hermes and qwen3_coder parsers)
CALL_MARKERS = {"hermes": ("<tool_call>", "<function="), "qwen3_coder": ("<function=", None)}


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def template_problems(
    files: ModelFiles, config: Any, item: dict, schemas: list[dict], offered: list[dict]
) -> list[str]:
    """What is wrong with the episode verl renders for `item` under the model's current template."""
    form = config.actor_rollout_ref.rollout.multi_turn.format
    episode = rehearse(files, config, item, schemas, offered)
    plain = files.renderer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=False)
    problems = []
    if episode.renders_tools:
        hidden = [
            s["function"]["name"]
            for s in offered
            if episode.prompt.count(s["function"]["name"]) <= plain.count(s["function"]["name"])
        ]
        if hidden:
            problems.append(
                f"renders no tool schemas ({len(hidden)} of {len(offered)} offered tools, e.g. {hidden[0]})"
            )
    else:  # the row's loop lists its tools in the prompt itself (MedExAgent's does)
        unnamed = [s["function"]["name"] for s in offered if s["function"]["name"] not in episode.prompt]
        if unnamed:
            problems.append(f"shows no {unnamed[0]} ({len(unnamed)} of {len(offered)} offered tools unnamed)")
    needed, refused = CALL_MARKERS[form]
    if needed not in episode.prompt or (refused is not None and refused in episode.prompt):
        problems.append(f"does not teach the {form} call form ({needed} in the tool instructions)")
    if episode.executed != [episode.tool]:
        problems.append(f"verl's {form} parser did not run the {episode.tool} call it was given")
    if "<tool_response>" not in episode.response or "</tool_response>" not in episode.response:
        problems.append("renders a tool's answer without <tool_response> markers")
    tail = final_segment(episode.response)
    if TOOL_OUTPUT in tail or episode.final.splitlines()[-1] not in tail:
        problems.append("leaves the reward reading tool output as the model's answer")
    if episode.image_sent and episode.image_pads == 0:
        problems.append("drops the tool's image (no image placeholder reached the model)")
    return problems


def chat_template(
    files: ModelFiles | None, config: Any, rows: dict[str, dict], schemas: list[dict], origin: str, model: str
) -> Check:
    name = "chat template"
    if files is None:
        return Check(
            name,
            UNVERIFIED,
            f"{model} is not on this machine (no directory, not in the Hugging Face cache); the run uses {origin}",
            f"download the model's files first (hf download {model}) to verify",
        )
    bad = {}
    for source, item in rows.items():
        problems = template_problems(files, config, item, schemas, offered_tools(item, schemas))
        if problems:
            bad[source] = problems
    form = config.actor_rollout_ref.rollout.multi_turn.format
    if bad:
        source, problems = next(iter(bad.items()))
        return Check(
            name,
            FAIL,
            f"{origin} {'; '.join(problems)} (rows of {', '.join(bad)}; first: {source})",
            "--chat-template shipped (case-env's for Qwen2.5-VL, Qwen3-VL, Qwen3) or --chat-template FILE "
            f"with a template that renders tools and <tool_response> blocks in the {form} form",
        )
    image = (
        ", the tool's image reaches the model"
        if files.processor is not None and any(_draws_any(item, schemas) for item in rows.values())
        else ""
    )
    return Check(
        name,
        PASS,
        f"{origin}: one row of each of {len(rows)} data source{'s' if len(rows) > 1 else ''} shows its tools, teaches {form} calls, fences "
        f"tool answers in <tool_response>{image}; the reward reads only the final answer",
    )


def tool_images(files: Any, rows: dict[str, dict], schemas: list[dict], env_vars: dict[str, str]) -> Check:
    """Images the tools draw reach only a model that reads them: verl raises on an image for a model without
    a processor, and its trainer drops that trajectory and trains the group on the rest."""
    name = "tool images"
    drawn = [s for s in rows if _draws_any(rows[s], schemas)]
    off = env_vars.get("CASE_ENV_TOOL_IMAGES", "").lower() in ("false", "0", "no")
    if not drawn:
        return Check(name, PASS, "no offered tool draws an image")
    if off:
        return Check(name, PASS, "answered as text (CASE_ENV_TOOL_IMAGES=false): the model reads text only")
    if files is None:
        return Check(
            name,
            UNVERIFIED,
            f"rows of {', '.join(drawn)} offer tools that draw images; without the model's files here it is "
            "not known whether it reads them",
            "download the model's files (hf download MODEL), or CASE_ENV_TOOL_IMAGES=false for a text model",
        )
    return Check(name, PASS, f"the model's processor reads the images of {', '.join(drawn)}'s tools")


def _draws_any(item: dict, schemas: list[dict]) -> bool:
    from case_env.verl.rehearsal import draws

    return any(draws(s) for s in offered_tools(item, schemas))


@dataclass
class Measured:
    """Every row's prompt length as the rollout renders it, by split: (data source, tokens or the error)."""

    rows: dict[str, list[tuple[str, int | str]]]

    @classmethod
    def of(cls, datasets: dict[str, Any]) -> Measured:
        rows: dict[str, list[tuple[str, int | str]]] = {}
        for split, dataset in datasets.items():
            rows[split] = []
            for index, row in enumerate(dataset.raw_rows()):
                try:
                    rows[split].append((row["data_source"], dataset.prompt_tokens(row)))
                except Exception as exc:
                    rows[split].append(
                        (row["data_source"], f"{split} row {index}: {type(exc).__name__}: {exc}")
                    )
        return cls(rows)

    def fitting(self, split: str, limit: int) -> int:
        """Rows of `split` that verl's length filter keeps."""
        return sum(isinstance(t, int) and t <= limit for _, t in self.rows[split])


def prompt_lengths(config: Any, measured: Measured | None) -> Check:
    """Every row of the banks measured as the rollout renders it (CaseRLHFDataset.prompt_tokens)."""
    name = "prompt lengths"
    limit = int(config.data.max_prompt_length)
    if measured is None:
        return Check(
            name, UNVERIFIED, "needs the model's tokenizer on this machine", "download the model first"
        )
    over: dict[str, list[int]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    longest, errors = 0, []
    for rows in measured.rows.values():
        for source, tokens in rows:
            counts[source] += 1
            if isinstance(tokens, str):
                errors.append(tokens)
                continue
            longest = max(longest, tokens)
            if tokens > limit:
                over[source].append(tokens)
    total = sum(counts.values())
    if errors:
        more = f" ({len(errors) - 1} more)" if len(errors) > 1 else ""
        return Check(
            name, FAIL, f"{len(errors)} rows cannot be rendered: {errors[0]}{more}", "fix the bank rows"
        )
    if over:
        parts = [f"{s} {len(v)} of {counts[s]} (longest {max(v):,})" for s, v in sorted(over.items())]
        fit = math.ceil(longest / 256) * 256
        return Check(
            name,
            FAIL,
            f"verl would drop rows over data.max_prompt_length={limit:,}: {'; '.join(parts)}",
            f"data.max_prompt_length={fit} (fits the longest, {longest:,} tokens)",
        )
    return Check(
        name,
        PASS,
        f"all {total:,} rows of {' and '.join(measured.rows)} fit {limit:,} tokens as their loops render them "
        f"(longest {longest:,}; {len(counts)} data source{'s' if len(counts) > 1 else ''})",
    )


def worst(found: list[Check]) -> Check:
    """One check of several alike (one per environment of a bank): the first that failed, else the first
    not verified or skipped, else the first."""
    for status in (FAIL, UNVERIFIED, SKIPPED):
        for check in found:
            if check.status == status:
                return check
    return found[0]


def served_tools(url: str, token: str | None, envs: list[str], schemas: list[dict]) -> Check:
    """The running server serves the bank's tools with the YAML's schemas."""
    name = "served tools"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    served = {}
    health = None
    for env in envs:
        try:
            if health is None:  # once: the server's health, not an environment's
                health = httpx.get(f"{url}/healthz", timeout=5)
            reply = httpx.get(f"{url}/v1/tools", params={"env": env}, headers=headers, timeout=10)
        except httpx.HTTPError as exc:
            return Check(
                name, FAIL, f"no case-env server answers at {url} ({type(exc).__name__})", "case-env serve"
            )
        if health.status_code != 200 or reply.status_code != 200:
            return Check(
                name,
                FAIL,
                f"{url} answers /healthz {health.status_code}, /v1/tools?env={env} {reply.status_code}",
                "set CASE_ENV_TOKEN (or --token-file) to the server's token"
                if reply.status_code == 401
                else "",
            )
        served.update({t["name"]: t["schema"] for t in reply.json()["tools"]})
    expected = {s["function"]["name"]: s for s in schemas}
    missing = sorted(set(expected) - set(served))
    differ = sorted(n for n in set(expected) & set(served) if _schema(served[n]) != _schema(expected[n]))
    if missing or differ:
        what = [
            f"missing {', '.join(missing[:5])}" if missing else "",
            f"other schemas: {', '.join(differ[:5])}",
        ]
        return Check(
            name,
            FAIL,
            f"{url} does not serve the bank's tool YAML ({'; '.join(w for w in what if w)})",
            "run the server of the case-env version that wrote the bank, or rebuild the YAML (case-env verl-config)",
        )
    return Check(
        name,
        PASS,
        f"{url} serves the {len(expected)} tools of the {' and '.join(envs)} YAML with the same schemas",
    )


def _schema(schema: dict) -> dict:
    """A schema as verl keeps it: type, description and enum of each parameter (verl/tools/schemas.py)."""
    from verl.tools.schemas import OpenAIFunctionToolSchema

    return OpenAIFunctionToolSchema.model_validate(schema).model_dump(exclude_unset=True, exclude_none=True)


def nodes(reports: list[NodeReport] | None, url: str, wanted: int, env_vars: dict[str, str]) -> Check:
    name = "server from every node"
    token = "CASE_ENV_TOKEN" in env_vars or "CASE_ENV_TOKEN_FILE" in env_vars
    loopback_fix = (
        "--server-host 0.0.0.0 with CASE_ENV_TOKEN (the launcher's server, called at this node's "
        "address), or --server-url http://<reachable host>:<port>"
    )
    if reports is None:
        if wanted > 1 and only_here(url):  # knowable from the arguments alone
            return Check(
                name,
                FAIL,
                f"{url} reaches only the machine calling it, and the other {wanted - 1} node(s) would each call "
                "their own",
                loopback_fix,
            )
        return Check(name, SKIPPED, "a dry run starts nothing (no Ray, no server)")
    remote = [r for r in reports if not r.local]
    problems = []
    if len(reports) < wanted:
        problems.append(f"the Ray cluster has {len(reports)} live node(s), the run asks for --nodes {wanted}")
    if remote and only_here(url):
        return Check(
            name,
            FAIL,
            f"{url} reaches only the machine calling it, and {len(remote)} other node(s) would each call their own",
            loopback_fix,
        )
    for report in reports:
        where = f"node {report.address} ({report.node_id[:8]})"
        if report.missing:
            problems.append(
                f"{where} lacks {', '.join(report.missing)} (a shared file system at the same path)"
            )
        elif report.url != url:
            problems.append(f"{where} sees CASE_ENV_URL={report.url}, not {url}")
        elif token and not report.token:
            problems.append(f"{where} has no token")
        elif not report.reached:
            problems.append(
                f"{where}: /healthz {report.health or '-'}, call {report.call or '-'} ({report.text})"
            )
    if problems:
        return Check(
            name, FAIL, "; ".join(problems), "make the server reachable from every node, with the token"
        )
    seen = ", ".join(
        f"{r.address}{' (here)' if r.local else ''} {r.call} {r.latency_ms:.0f} ms" for r in reports
    )
    # verl prints the whole config, the job's runtime environment included, at start-up
    printed = (
        " (verl prints it with its config: --token-file keeps it out)" if "CASE_ENV_TOKEN" in env_vars else ""
    )
    return Check(
        name,
        PASS,
        f"{len(reports)} node{'s' if len(reports) > 1 else ''} called {url} through CaseTool with the job's "
        f"environment{' and the token' if token else ''}{printed}: {seen}",
    )


def steps_per_epoch(config: Any, train_rows: int) -> int:
    """As verl counts them: its training loader drops the last partial batch (`drop_last=True`,
    trainer/ppo/ray_trainer.py)."""
    return train_rows // int(config.data.train_batch_size)


def padded_batch(config: Any) -> tuple[int, int, int]:
    """(sequences of a step, what verl pads them to, sequences per mini-batch): the V1 trainer pads a step's
    batch to a multiple of lcm(data-parallel size, the actor's mini-batch in sequences)
    (`_get_required_batch_multiple`, trainer/ppo/v1/trainer_base.py)."""
    n = int(config.actor_rollout_ref.rollout.n)
    sequences = int(config.data.train_batch_size) * n
    mini = int(config.actor_rollout_ref.actor.ppo_mini_batch_size) * n
    world = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    multiple = math.lcm(world, mini)
    return sequences, -(-sequences // multiple) * multiple, mini


def batches(config: Any, train_rows: int, fitting: str = "") -> Check:
    """What a step is: steps per epoch as verl counts them (none is a run that trains nothing), and the
    updates of a step (a batch verl must pad makes more updates of fewer real sequences)."""
    name = "batches"
    batch, epochs = int(config.data.train_batch_size), int(config.trainer.total_epochs)
    per_epoch = steps_per_epoch(config, train_rows)
    if per_epoch == 0:
        return Check(
            name,
            FAIL,
            f"{train_rows} training rows{fitting} make no full batch of {batch}: verl drops the last partial "
            "batch, so the run would take no step",
            f"--batch-size {max(1, train_rows)} or fewer, or a larger bank",
        )
    sequences, padded, mini = padded_batch(config)
    world = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    if padded != sequences:
        return Check(
            name,
            FAIL,
            f"a step's {sequences} sequences are padded to {padded} ({padded - sequences} dummies) to share over "
            f"{world} GPUs in mini-batches of {mini}: {padded // mini} updates of about {sequences * mini // padded} "
            f"real sequences instead of {sequences // mini}",
            "sizes that divide: " + ", ".join(_dividing(config, world)),
        )
    return Check(
        name,
        PASS,
        f"{train_rows} training rows{fitting}: {per_epoch} steps per epoch x {epochs} epoch(s); each step "
        f"{sequences} sequences in {sequences // mini} updates of {mini} on {world} GPUs",
    )


def _dividing(config: Any, world: int) -> list[str]:
    """Batch sizes near the run's, and GPU counts, whose steps need no padding: with OPSD, the teacher's share
    of each node (it keeps at least one), else the student's."""
    from case_env.verl.options import unpadded

    n = int(config.actor_rollout_ref.rollout.n)
    batch = int(config.data.train_batch_size)
    ratio = batch // max(1, int(config.actor_rollout_ref.actor.ppo_mini_batch_size))  # updates per step
    nodes = int(config.trainer.nnodes)
    near = sorted(
        (b for b in range(ratio, 4 * batch + 1, ratio) if unpadded(b, n, ratio, world)),
        key=lambda b: abs(b - batch),
    )
    found = [f"--batch-size {b}" for b in sorted(near[:2])]
    students = int(config.trainer.n_gpus_per_node)
    if config.distillation.get("enabled"):
        node = students + int(config.distillation.n_gpus_per_node)
        fit = [w for w in range(1, node) if unpadded(batch, n, ratio, w * nodes)]
        found += [f"--teacher-gpus {node - w} ({w} student GPU(s) per node)" for w in fit[-1:]]
    else:
        fit = [w for w in range(1, students + 3) if unpadded(batch, n, ratio, w * nodes)]
        found += [f"--gpus {w}" for w in fit[-1:]]
    return found or ["--batch-size a multiple of the GPUs' count"]


def logged(config: Any) -> Check:
    """What the run's log shows each step and at validation. verl 0.9.1's V1 trainer logs a training step's
    reward as `critic/score/*` and nothing of the reward's other keys; the launcher's trainer mode
    (`case_env/verl/steps.py`) adds them."""
    from case_env.reward import FAILURE_KEYS
    from case_env.verl.steps import MODE

    name = "logged per step"
    keys = ", ".join(("acc", "format_ok", "judge_fallback", *FAILURE_KEYS))
    test_freq = int(config.trainer.test_freq)
    validation = (
        f"per data source at validation every {test_freq} steps"
        if test_freq > 0
        else f"no validation (trainer.test_freq {test_freq})"
    )
    if config.trainer.v1.trainer_mode != MODE:
        return Check(
            name,
            UNVERIFIED,
            f"trainer.v1.trainer_mode {config.trainer.v1.trainer_mode}: each step the reward (critic/score/mean) "
            f"only; {keys} {validation}",
            f"trainer.v1.trainer_mode={MODE} (verl's synchronous trainer, logging the reward's keys)",
        )
    return Check(
        name,
        PASS,
        f"each step: the reward (critic/score/mean) and its keys as reward/<key>/mean ({keys}), the "
        f"trajectories dropped for a loop that raised (rollouts/dropped), lengths, turns, the actor's loss and KL; "
        f"{validation}; rollouts the infrastructure failed are masked out, and past "
        "--max-failed-rollouts the run stops",
    )


def checkpoints(config: Any, train_rows: int, allowed_off: bool, identity: dict | None = None) -> Check:
    """Where checkpoints go, and where the run resumes from as verl decides it: the step its tracker file
    (`latest_checkpointed_iteration.txt`) names, under `resume_mode=auto`; checkpoints of another run (another
    model or bank: `identity` against the run file beside them) or past the run's own end are refused."""
    name = "checkpoints"
    trainer = config.trainer
    steps = trainer.total_training_steps or steps_per_epoch(config, train_rows) * trainer.total_epochs
    validation = (
        f"validation every {trainer.test_freq} steps"
        if trainer.test_freq > 0
        else "no validation during training"
    ) + (", and before training" if trainer.val_before_train else ", none before training")
    if trainer.save_freq <= 0:
        if allowed_off:
            return Check(name, PASS, f"none saved (--no-checkpoints); {validation}")
        return Check(
            name,
            FAIL,
            f"trainer.save_freq={trainer.save_freq}: a run of ~{steps} steps would end with no weights",
            "trainer.save_freq=N (N > 0), or --no-checkpoints to run without",
        )
    directory = Path(trainer.default_local_dir)
    parent = next(p for p in (directory, *directory.parents) if p.exists())
    if not os.access(parent, os.W_OK):
        return Check(name, FAIL, f"{parent} is not writable", "--checkpoint-dir DIR on a writable disk")
    saves = math.ceil(steps / trainer.save_freq)
    resume, problem = _resume(directory, trainer.resume_mode, steps, identity)
    if problem is not None:
        return Check(
            name,
            FAIL,
            problem,
            "--checkpoint-dir DIR for this run, or trainer.resume_mode=disable to start afresh",
        )
    keep = trainer.max_actor_ckpt_to_keep
    return Check(
        name,
        PASS,
        f"every {trainer.save_freq} steps and the last (~{steps} steps: {saves} save{'s' if saves > 1 else ''}) to {directory}"
        f"{f', latest {keep} kept' if keep else ''}; {resume}; {validation}",
    )


def _resume(directory: Path, mode: str, steps: int, identity: dict | None) -> tuple[str, str | None]:
    """(where the run resumes from, the problem with it or None), read as verl reads it."""
    import json

    from case_env.verl.launch import RUN_FILE

    if mode != "auto":
        return f"resume {mode}", None
    tracker = directory / "latest_checkpointed_iteration.txt"
    folders = list(directory.glob("global_step_*"))
    if not tracker.is_file():
        if folders:
            return (
                f"starts afresh: {len(folders)} global_step_* folder(s) but no {tracker.name} (verl reads only that)",
                None,
            )
        return "starts afresh (no checkpoint yet)", None
    step = int(tracker.read_text().strip() or 0)
    recorded = directory / RUN_FILE
    theirs = json.loads(recorded.read_text()) if recorded.is_file() else None
    if identity is not None and theirs != identity:
        what = (
            "no record of which run they are of"
            if theirs is None
            else ", ".join(
                f"{k} {theirs.get(k)!r} (this run: {v!r})" for k, v in identity.items() if theirs.get(k) != v
            )
        )
        return (
            "",
            f"{directory} holds global_step_{step} of another run ({what}): verl would resume its weights",
        )
    if step >= steps:
        return (
            "",
            f"resumes from global_step_{step} of a run planned at ~{steps} steps: verl would train nothing",
        )
    return f"resumes from global_step_{step} (of ~{steps})", None


def verl_pins() -> dict[str, str]:
    """The versions verl's own extras pin, by package (`vllm==0.24.0; extra == "vllm"` in its metadata)."""
    pins = {}
    for requirement in importlib.metadata.requires("verl") or []:
        match = re.match(r"([\w.-]+)==([\w.]+)\s*;\s*extra\s*==", requirement)
        if match:
            pins.setdefault(match.group(1), match.group(2))
    return pins


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _import_error(module: str) -> str | None:
    """Why `module` does not import in a fresh interpreter (engines pull in CUDA), or None when it does."""
    probe = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=600
    )
    if probe.returncode == 0:
        return None
    return (probe.stderr.strip().splitlines() or ["no output"])[-1]


def rollout_engine(config: Any) -> Check:
    """The inference engine at verl 0.9.1's pin, and flash-attn when the model loads with it (verl's
    default `attn_implementation`), both importable by this interpreter."""
    name = "rollout engine"
    engine = config.actor_rollout_ref.rollout.name
    attention = OmegaConf.select(
        config, "actor_rollout_ref.model.override_config.attn_implementation", default=None
    )
    needed = [engine] + (["flash-attn"] if attention in (None, "flash_attention_2") else [])
    pins = verl_pins()
    fix = f"make train-env ENGINE={engine}, then PYTHON=.venv-train-{engine}/bin/python scripts/train_grpo.sh ..."
    seen = []
    for package in needed:
        version, pinned = _version(package), pins.get(package)
        if version is None:
            return Check(name, FAIL, f"{package} is not installed in {sys.executable}", fix)
        if pinned and version != pinned:
            return Check(name, FAIL, f"{package} {version}; verl 0.9.1 pins {package}=={pinned}", fix)
        error = _import_error(package.replace("-", "_"))
        if error is not None:
            return Check(name, FAIL, f"{package} {version} does not import: {error}", fix)
        seen.append(f"{package} {version}")
    return Check(name, PASS, f"{' and '.join(seen)} import (verl 0.9.1's pins)")


def gpus(reports: list[NodeReport] | None, per_node: int, wanted_nodes: int) -> Check:
    name = "GPUs"
    if reports is None:
        import torch

        seen = {"this node": torch.cuda.device_count()}
    else:
        seen = {r.address + (" (here)" if r.local else ""): int(r.gpus) for r in reports}
    enough = [where for where, n in seen.items() if n >= per_node]
    listing = ", ".join(f"{where} {n}" for where, n in seen.items())
    if len(enough) < wanted_nodes:
        return Check(
            name,
            FAIL,
            f"{per_node} GPU(s) on each of {wanted_nodes} node(s) asked for; visible: {listing}",
            "--gpus N (GPUs per node) and --nodes N as the cluster has them; check CUDA_VISIBLE_DEVICES",
        )
    return Check(name, PASS, f"{per_node} per node on {wanted_nodes} node(s): {listing}")


def episode_ids(config: Any) -> Check:
    """Two trajectories' episode ids as CaseTool derives them from verl's request ids under this config."""
    from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop

    from case_env.verl.tool import episode_id

    determinism = bool(config.actor_rollout_ref.rollout.full_determinism)
    ids = []
    for _ in range(2):  # the V1 worker passes no priority: every request id is the same under determinism
        request = ToolAgentLoop._make_request_id(0, determinism)
        agent = AgentData([], None, None, None, None, {}, request, {})
        ids.append(episode_id(agent, "instance"))
    if ids[0] == ids[1]:
        return Check("episode ids", FAIL, f"two trajectories share episode {ids[0]}: the server answers 403")
    mode = (
        "full_determinism: verl's det-0 made unique per trajectory" if determinism else "verl's request ids"
    )
    return Check("episode ids", PASS, f"unique per trajectory ({mode})")


def quiet():
    """verl's dataset and tool loader print progress and every schema; the table is what the user reads."""
    import datasets

    datasets.disable_progress_bars()
    return contextlib.redirect_stdout(io.StringIO())


def masked(config: Any) -> str:
    """The whole config as YAML, the token shown as ***."""
    copy = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    env = OmegaConf.select(copy, "ray_kwargs.ray_init.runtime_env.env_vars")
    if env is not None and "CASE_ENV_TOKEN" in env:
        env.CASE_ENV_TOKEN = "***"
    return OmegaConf.to_yaml(copy)


def distillation(config: Any, train: Any) -> Check:
    """OPSD's teacher and the rows it reads privileged: how many training rows carry `teacher_insight`
    (a row without one is distilled from the plain prompt, verl's own behaviour)."""
    name = "distillation"
    if not config.distillation.enabled:
        return Check(name, PASS, "off")
    from case_env.verl.distill import insight_of

    rows = train.raw_rows()
    extras = rows["extra_info"] if "extra_info" in rows.column_names else []
    with_insight = sum(bool(insight_of({"extra_info": extra})) for extra in extras)
    teacher = config.distillation.teacher_models.teacher_model
    pool = f"{config.distillation.n_gpus_per_node} GPU(s) x {config.distillation.nnodes} node(s)"
    detail = (
        f"OPSD: {with_insight} of {len(extras)} training rows carry teacher_insight; teacher "
        f"{teacher.model_path} on {pool}, the student on {config.trainer.n_gpus_per_node} per node"
    )
    if with_insight == 0:
        return Check(
            name,
            FAIL,
            detail + ": no row gives the teacher privileged context",
            "build the bank with case-env bank build (every environment writes teacher_insight), or --no-opsd",
        )
    return Check(name, PASS, detail)


def judge(
    env: Any, env_vars: dict[str, str], live: bool, nodes: int = 1, weights: Mapping[str, float] | None = None
) -> Check:
    """A reward that asks a judge has one: without `CASE_ENV_JUDGE_URL` it would fall back to its rules on
    every row, silently, and on several nodes it is reachable from each (verl spreads its reward workers over
    every node: a loopback judge would answer one node's rows, the others' would fall back one by one).
    Live, the judge is asked one question."""
    from case_env.core.parts import Training

    name = "judge"
    if not isinstance(env, Training) or not env.asks_judge(env_vars, weights or {}):
        return Check(name, PASS, f"the {env.title} reward asks no judge under this run's settings")
    url = env_vars.get("CASE_ENV_JUDGE_URL")
    if not url:
        rules = f", or run it rule-graded: {env.rule_graded}" if env.rule_graded else ""
        return Check(
            name,
            FAIL,
            f"the {env.title} reward is graded by a judge under this run's settings, and CASE_ENV_JUDGE_URL is "
            "unset: its rules would grade every row instead, without a word",
            f"CASE_ENV_JUDGE_URL=<an OpenAI-compatible server> (CASE_ENV_JUDGE_MODEL its model){rules}",
        )
    if nodes > 1 and only_here(url):
        return Check(
            name,
            FAIL,
            f"CASE_ENV_JUDGE_URL={url} reaches only the machine calling it, and verl scores rows on all {nodes} "
            "nodes: the other nodes' rows would be graded by rules instead",
            "serve the judge on an address every node reaches and set CASE_ENV_JUDGE_URL to it",
        )
    if not live:
        return Check(name, SKIPPED, f"a dry run asks no judge ({url})")
    from case_env.core.llm import default_judge

    started = time.monotonic()
    reply = default_judge().complete([{"role": "user", "content": "Reply with the word ready."}], fresh=True)
    if reply is None:
        return Check(
            name, FAIL, f"the judge at {url} did not answer", "start it, or check CASE_ENV_JUDGE_URL"
        )
    return Check(name, PASS, f"the judge at {url} answered in {(time.monotonic() - started) * 1000:.0f} ms")
