"""GRPO with multi-turn tools on verl 0.9.1 against a case-env server: the run's options and verl config.

`case_env.verl.grpo` starts the run (scripts/train_grpo.sh, `case-env train run`).

Every override below composes against verl 0.9.1's `ppo_trainer` config (docs/sources.md, verl 0.9.1):
`actor_rollout_ref.rollout.multi_turn.*` for tools, `agent.default_agent_loop=tool_agent`, the reward under
`reward.custom_reward_function.*` (the legacy top-level keys are ignored by main_ppo), the CASE dataset class
for JSON `extra_info` and per-row prompt lengths, the chat template when the model's own renders no tools,
checkpoints and validation, and the server's URL and token in the Ray job's environment so that workers on
every node reach it.

Token budget: tool text is cut at 2048 characters (`max_tool_response_length`, characters not tokens);
images are never cut and count against `data.max_response_length`: a 448 x 348 slice costs about 200
Qwen2.5-VL tokens ((448/28) x (348/28)), a 448 x 188 comparison panel about 110, a coronal 202 x 448
image about 115. With up to 8 assistant turns, 16384 response tokens leave room for about 20 images plus
reasoning.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import httpx

import case_env.reward
from case_env.core import registry
from case_env.core.bank import bank_sources, split_file
from case_env.core.parts import Training
from case_env.reward import score_deadline_s
from case_env.server.control import is_loopback
from case_env.verl import steps
from case_env.verl.config import write
from case_env.verl.options import TEMPLATE_CHOICES, recipes

BASE_VALUES = {"data.max_prompt_length": "6144"}  # what other settings are derived from
BASE_TURNS = {  # ours: the turns a bank's question needs at most, and tool text cut at 2048 characters
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": "8",
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": "8",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": "2048",
}
MANAGER = "case_env.verl.distill.PrivilegedAgentLoops"
# What the teacher's prompt may hold beyond the student's (tokens): an insight past it falls back to the
# plain prompt (distill.py). Ours: the insights of our banks are tens to a few hundred tokens.
INSIGHT_TOKENS = 1024
REWARD_WORKERS = 8  # verl's reward.num_workers default; each is a process with its own limiter
# calls of one turn that run (verl's default runs the first and drops the rest without telling the model);
# ours: a question that needs two measurements is often answered with two calls at once by Qwen models
PARALLEL_CALLS = 4
REWARD_TIMEOUT_MARGIN_S = 30.0


def _module_file(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    return Path(spec.origin).resolve()


def hydra_value(value: str) -> str:
    """`value` as one quoted Hydra override value that composes back to exactly `value`."""
    if "${" in value:
        # verl resolves its whole config (OmegaConf.resolve), which would read this as an interpolation
        raise ValueError("a value passed to verl cannot contain '${'")
    value = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)  # backslashes before a quote doubled
    value = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, value)
    return f"'{value}'"


@dataclass
class Plan:
    """Everything a run is composed from: the options, the bank's tool YAML, the chat template chosen for the
    model, and the server as the workers will call it."""

    args: SimpleNamespace
    extra: list[str]
    chat_template: str | None = None
    template_origin: str = "the model's own"
    env_vars: dict[str, str] = field(default_factory=dict)

    @property
    def worker_url(self) -> str:
        return self.env_vars.get("CASE_ENV_URL", self.args.server_url)

    def overrides(self) -> list[str]:
        """The base recipe, then the chosen recipe's values, then the user's own: for a key set twice the
        last one stays (Hydra refuses a key given twice)."""
        items = [
            *self._base(),
            *(f"{k}={v}" for k, v in recipes()[self.args.recipe].overrides.items()),
            *(["trainer.save_freq=-1"] if self.args.no_checkpoints else []),  # over the recipe's own
            *self.extra,
        ]
        return [item for i, item in enumerate(items) if not _overridden(item, items[i + 1 :])]

    def _base(self) -> list[str]:
        args = self.args
        data = args.data.resolve()
        mini_batch = max(1, args.batch_size // recipes()[args.recipe].updates_per_step)
        items = [
            "algorithm.adv_estimator=grpo",
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'val.parquet'}",
            f"data.train_batch_size={args.batch_size}",
            f"data.max_prompt_length={BASE_VALUES['data.max_prompt_length']}",
            "data.max_response_length=16384",
            "data.filter_overlong_prompts=True",
            # found, not imported: importing it imports verl (seconds), and argument errors answer first
            f"data.custom_cls.path={_module_file('case_env.verl.dataset')}",
            "data.custom_cls.name=CaseRLHFDataset",
            # the recipe's reward weights, which the dataset class writes into every row it loads
            *(f"+data.reward_weights.{k}={v}" for k, v in recipes()[args.recipe].reward_weights.items()),
            f"actor_rollout_ref.model.path={args.model}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}",
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576",
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.kl_loss_coef=0.001",
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
            f"actor_rollout_ref.rollout.name={args.rollout}",
            f"actor_rollout_ref.rollout.n={args.group_size}",
            "actor_rollout_ref.rollout.multi_turn.enable=True",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={args.tool_config.resolve()}",
            f"actor_rollout_ref.rollout.multi_turn.format={args.format}",
            *(f"{key}={value}" for key, value in BASE_TURNS.items()),
            f"actor_rollout_ref.rollout.multi_turn.max_parallel_calls={PARALLEL_CALLS}",
            "actor_rollout_ref.rollout.agent.num_workers=8",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
            *agent_loop_overrides(data, args.tool_config.resolve().parent, args.max_failed_rollouts),
            *self._distillation(),
            *self._reward_manager(),
            f"reward.custom_reward_function.path={Path(case_env.reward.__file__).resolve()}",
            "reward.custom_reward_function.name=compute_score",
            f"trainer.n_gpus_per_node={args.gpus - (args.teacher_gpus if args.opsd else 0)}",
            f"trainer.nnodes={args.nodes}",
            f"trainer.total_epochs={args.epochs}",
            "trainer.project_name=case-env",
            f"trainer.experiment_name={args.experiment}",
            "trainer.logger=[console]",
            # verl's synchronous trainer logging the reward's keys each step (case_env/verl/steps.py), registered
            # in every Ray worker of the job by Ray's setup hook
            f"trainer.v1.trainer_mode={steps.MODE}",
            f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={steps.HOOK}",
            # ours: a checkpoint every 20 steps and the last (verl saves only when save_freq > 0, its default
            # is -1), the latest two kept (a 7B checkpoint with optimizer state is ~100 GB), validation every
            # 10 steps and before training, resumed from the latest checkpoint of the directory when there is one
            "trainer.save_freq=20",
            "trainer.max_actor_ckpt_to_keep=2",
            "trainer.test_freq=10",
            "trainer.val_before_train=True",
            "trainer.resume_mode=auto",
            f"trainer.default_local_dir={args.checkpoint_dir}",
        ]
        if self.chat_template is not None:
            items.append(f"actor_rollout_ref.model.custom_chat_template={hydra_value(self.chat_template)}")
        for key, value in self.env_vars.items():  # reach every Ray worker, on every node
            items.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}={hydra_value(value)}")
        return items

    def _distillation(self) -> list[str]:
        """OPSD (case_env/verl/distill.py) on verl's distillation path: the teacher served on
        `--teacher-gpus` of every node, its prompt long enough for the student's and the insight, and
        verl's agent loop manager built with workers whose teacher reads the privileged prompt. verl's loss
        settings are its defaults unless a recipe sets them (k3 over the student's tokens, added to GRPO's
        loss at coefficient 1)."""
        args = self.args
        if not args.opsd:
            return []
        teacher = "distillation.teacher_models.teacher_model"
        parallel = 2 if args.teacher_gpus % 2 == 0 else 1
        return [
            "distillation.enabled=True",
            f"distillation.n_gpus_per_node={args.teacher_gpus}",
            f"distillation.nnodes={args.nodes}",
            f"{teacher}.model_path={args.teacher_model}",
            f"{teacher}.inference.tensor_model_parallel_size={parallel}",
            f"{teacher}.inference.prompt_length={int(self._value('data.max_prompt_length')) + INSIGHT_TOKENS}",
            f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER}",
        ]

    def _value(self, key: str) -> str:
        """A key's value as the run will have it: the user's, else the recipe's, else the base recipe's."""
        given = [i.split("=", 1)[1] for i in self.extra if "=" in i and _key(i) == key]
        recipe = recipes()[self.args.recipe].overrides
        return given[-1] if given else recipe.get(key, BASE_VALUES[key])

    def judged(self) -> bool:
        """The bank's rewards ask a judge and the workers are told where it is."""
        envs = map(registry.get, bank_envs(self.args.data.resolve()))
        weights = recipes()[self.args.recipe].reward_weights
        asks = any(isinstance(env, Training) and env.asks_judge(self.env_vars, weights) for env in envs)
        return asks and bool(self.env_vars.get("CASE_ENV_JUDGE_URL"))

    def _reward_manager(self) -> list[str]:
        """verl's rate-limited manager for rewards that ask a judge: it awaits our coroutine reward (a plain
        function would hold one of a few executor threads for a judge's whole round trip), bounded
        across its workers; its own timeout is set past our scoring deadline, since a row it times out gets
        other keys than its batch (`timeout`, `acc`) and ours falls back to the offline grader first."""
        args = self.args
        name = args.reward_manager
        if name == "auto":
            name = "rate_limited" if self.judged() else "naive"
        items = [f"reward.reward_manager.name={name}"]
        if name == "rate_limited":
            # verl reads these from the raw config (`config.reward.get(...)`), per reward worker process,
            # and defaults max_concurrent to 1
            workers = REWARD_WORKERS
            items += [
                f"reward.num_workers={workers}",
                f"+reward.max_concurrent={max(1, -(-args.judge_concurrency // workers))}",
                f"+reward.timeout={score_deadline_s() + REWARD_TIMEOUT_MARGIN_S:g}",
            ]
            if args.judge_rpm is not None:
                items.append(f"+reward.max_rpm={max(1, args.judge_rpm // workers)}")
            if args.judge_tpm is not None:
                items.append(f"+reward.max_tpm={max(1, args.judge_tpm // workers)}")
        return items


def _key(item: str) -> str:
    return item.split("=", 1)[0].lstrip("+~")


def _overridden(item: str, later: list[str]) -> bool:
    return any(_key(other) == _key(item) for other in later)


def forwarded_env(args: SimpleNamespace, url: str) -> dict[str, str]:
    """What rollout and reward workers read from their environment: the server's URL and token (or the token
    file's path), and every other CASE_ENV_* setting of this shell (the judge's CASE_ENV_JUDGE_URL, say), which
    verl would not forward (trainer/constants_ppo.py)."""
    from case_env.server.ray_serve import settings_env

    env = {**settings_env(), "CASE_ENV_URL": url}
    if args.token_file is not None:
        env.pop("CASE_ENV_TOKEN", None)
        env["CASE_ENV_TOKEN_FILE"] = str(args.token_file.resolve())
    return env


def worker_url(args: SimpleNamespace) -> str:
    """The URL workers call: --server-url, or this node's address when the launcher's server listens beyond
    loopback and --server-url names loopback (which on another node is that node)."""
    url = args.server_url
    if is_loopback(httpx.URL(url).host) and not is_loopback(args.server_host):
        from ray.util import get_node_ip_address

        parsed = httpx.URL(url)
        host = args.server_host if args.server_host not in ("0.0.0.0", "::") else get_node_ip_address()
        return str(parsed.copy_with(host=host))
    return url


def token(args: SimpleNamespace) -> str | None:
    if args.token_file is not None:
        return args.token_file.read_text(encoding="utf-8").splitlines()[0].strip() or None
    return os.environ.get("CASE_ENV_TOKEN") or None


def compose(items: list[str], config_name: str = "ppo_trainer"):
    """verl's own trainer config (`ppo_trainer`, or another of its trainers') with our overrides, as its
    entry point would see it."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name=config_name, overrides=items)


def validate(config) -> None:
    from verl.trainer.main_ppo import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )


def check_inputs(args: SimpleNamespace) -> list[str]:
    problems = []
    for split in ("train", "val"):
        try:
            split_file(args.data, split)
        except FileNotFoundError as exc:
            problems.append(str(exc))
            if not args.data.is_dir():
                break  # one line for a bank that is not there at all
    if args.tool_config is not None and not args.tool_config.is_file():
        problems.append(f"{args.tool_config} is missing (run `case-env verl-config`)")
    if args.token_file is not None and not args.token_file.is_file():
        problems.append(f"--token-file {args.token_file} is not a file")
    if args.opsd and not 0 < args.teacher_gpus < args.gpus:
        problems.append(
            f"--teacher-gpus {args.teacher_gpus} with --gpus {args.gpus}: OPSD's teacher needs GPUs of its own "
            "on every node and the student at least one (or --no-opsd)"
        )
    if args.chat_template not in TEMPLATE_CHOICES and not Path(args.chat_template).is_file():
        problems.append(
            f"--chat-template {args.chat_template!r} is neither {', '.join(TEMPLATE_CHOICES)} nor a file"
        )
    return problems


def bank_envs(data: Path) -> list[str]:
    """The environments of a bank's training rows, by name; a bank of several is refused when their rows
    would need different turn limits or tool-text lengths (`mix_problems`)."""
    envs = sorted(
        {
            registry.for_row(source, {"env": env} if env else None).name
            for env, source in bank_sources(data / "train.parquet")
        }
    )
    problems = mix_problems(envs)
    if problems:
        raise RunRefusedError(problems)
    return envs


TURN_KEYS = {  # verl's multi_turn settings, one per run: what a bank's environments must agree on
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": "assistant turns",
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": "user turns",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": "tool-text characters",
}


def turn_limits(name: str) -> dict[str, str]:
    """The turn limits and tool-text length an environment's rows are built for: those its own recipes set
    (a published system's, say), else the launcher's base values."""
    env = registry.get(name)
    limits = dict(BASE_TURNS)
    for recipe in env.recipes.values() if isinstance(env, Training) else ():
        limits.update({k: v for k, v in recipe.overrides.items() if k in TURN_KEYS})
    return limits


def mix_problems(envs: list[str]) -> list[str]:
    """Why a bank of these environments cannot be one run: verl's turn limits and tool-text length are one
    per run, so environments built for different ones would each be played by the other's."""
    limits = {name: turn_limits(name) for name in envs}
    if len({tuple(sorted(v.items())) for v in limits.values()}) <= 1:
        return []
    each = "; ".join(
        f"{name}: " + ", ".join(f"{limits[name][k]} {what}" for k, what in TURN_KEYS.items()) for name in envs
    )
    return [
        f"the bank mixes environments built for different turn limits ({each}), and verl's are one per run: "
        "train each environment on its own bank"
    ]


def agent_loop_overrides(data: Path, folder: Path, max_failed_rollouts: float) -> list[str]:
    """The agent loops verl registers in every AgentLoopWorker (`rollout.agent.agent_loop_config_path`), listed
    in a file in `folder` (where the tool YAML went: beside the bank, or a dry run's temporary copy): case-env's
    `tool_agent` (`case_env.verl.loop`) in place of verl's, and the bank's environments' own (`Training.agent_loops`);
    rows choose by `agent_name`."""
    loops = {"tool_agent": "case_env.verl.loop.CaseToolAgentLoop"}
    for env in map(registry.get, bank_envs(data)):
        if isinstance(env, Training):
            loops.update(env.agent_loops)
    path = folder / "verl_agent_loops.yaml"
    path.write_text(
        "".join(
            f"- name: {name}\n  _target_: {target}\n  max_failed_rollouts: {max_failed_rollouts}\n"
            for name, target in loops.items()
        )
    )
    return [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}"]


def bank_tool_config(data: Path, dry_run: bool = False) -> Path:
    """The tool YAML of the bank's environments, written beside the bank (always equal to their tools); a dry
    run writes nothing there, so it composes with a copy in a temporary directory."""
    folder = data
    if dry_run:
        folder = Path(tempfile.mkdtemp(prefix="case-env-dry-run-"))
        atexit.register(shutil.rmtree, folder, True)
    return write([registry.get(name) for name in bank_envs(data)], folder / "verl_tools.yaml")


def concurrency(args: SimpleNamespace) -> int:
    """Calls a step may put on the server at once: every trajectory with a turn's calls in flight."""
    return args.batch_size * args.group_size * PARALLEL_CALLS


RUN_FILE = "case_env_run.json"  # beside verl's checkpoints: which run they are of


def run_identity(args: SimpleNamespace) -> dict[str, str]:
    """What makes a run's checkpoints its own: the model, the bank (its training rows' bytes) and the recipe."""
    import hashlib

    train = args.data.resolve() / "train.parquet"
    digest = hashlib.sha256(train.read_bytes()).hexdigest()[:16] if train.is_file() else ""
    return {
        "model": str(args.model),
        "bank": str(args.data.resolve()),
        "train_sha256": digest,
        "recipe": args.recipe,
    }


def record_identity(args: SimpleNamespace) -> None:
    """Write the run's identity beside its checkpoints before verl starts (a later run checks it)."""
    import json

    folder = Path(args.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RUN_FILE
    if not path.exists():
        path.write_text(json.dumps(run_identity(args), indent=2) + "\n", encoding="utf-8")


class RunRefusedError(Exception):
    """The run cannot be composed as asked: one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems
