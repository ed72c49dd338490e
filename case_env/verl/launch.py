"""GRPO with multi-turn tools on verl 0.9.1 against a case-env server (used by scripts/train_grpo.sh).

Every override below composes against verl 0.9.1's `ppo_trainer` config (docs/sources.md, verl 0.9.1): `actor_rollout_ref.rollout.multi_turn.*` for tools, `agent.default_agent_loop=tool_agent`, the reward
under `reward.custom_reward_function.*` (the legacy top-level keys are ignored by main_ppo), and the CASE
dataset class for JSON `extra_info`. `--dry-run` composes the whole config with verl's own Hydra files
and runs verl's `validate_config` on CPU, then exits; nothing is started.

Token budget: tool text is cut at 2048 characters (`max_tool_response_length`, characters not tokens);
images are never cut and count against `data.max_response_length`: a 448 x 348 slice costs about 200
Qwen2.5-VL tokens ((448/28) x (348/28)), a 448 x 188 comparison panel about 110, a coronal 202 x 448
image about 115. With up to 8 assistant turns, 16384 response tokens leave room for about 20 images plus
reasoning.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import case_env.reward
import case_env.verl.dataset as case_dataset
from case_env.core import registry
from case_env.core.bank import bank_sources
from case_env.core.calls import FORMATS
from case_env.server.control import ensure_server
from case_env.verl.config import write

# A recipe is the overrides that differ from the base recipe (`grpo`, ours). `medexagent` is MedExAgent's RL
# run (config/rl_config.yaml; docs/sources.md, MedExAgent): "DAPO" there is GRPO with clip-higher (0.2 / 0.3),
# no KL term, entropy bonus 0.002, 16 samples per prompt at temperature 1.0, lr 1e-6, batch 64, one epoch,
# SGLang, a 4,096-token prompt and a 16,384-token response, at most 20 assistant and 15 user turns. verl
# counts every tool response as a user turn, and the patient is a tool here, so its 15 bounds questions and
# exams together where MedExAgent's bounded the patient's replies alone.
RECIPES: dict[str, dict[str, str]] = {
    "grpo": {},
    "medexagent": {
        "data.max_prompt_length": "4096",
        "data.max_response_length": "16384",
        "actor_rollout_ref.actor.use_kl_loss": "False",
        "actor_rollout_ref.actor.kl_loss_coef": "0.0",
        "actor_rollout_ref.actor.clip_ratio_low": "0.2",
        "actor_rollout_ref.actor.clip_ratio_high": "0.3",
        "actor_rollout_ref.actor.entropy_coeff": "0.002",
        "actor_rollout_ref.actor.optim.lr": "1e-6",
        "algorithm.use_kl_in_reward": "False",
        "actor_rollout_ref.rollout.temperature": "1.0",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": "20",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns": "15",
    },
}
# The recipe's values for options a user may still set: (group size, epochs, engine).
RECIPE_DEFAULTS = {"grpo": (8, 3, "vllm"), "medexagent": (16, 1, "sglang")}


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="scripts/train_grpo.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help="Model path or Hugging Face id (a VL model: tools return images)."
    )
    parser.add_argument(
        "--data", required=True, type=Path, help="Bank directory with train.parquet and val.parquet."
    )
    parser.add_argument("--server-url", default="http://127.0.0.1:8000", help="case-env server URL.")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node.")
    parser.add_argument("--nodes", type=int, default=1, help="Nodes.")
    parser.add_argument(
        "--data-root",
        type=Path,
        default=Path("data/synthetic"),
        help="Data root for the server started when none answers at --server-url.",
    )
    parser.add_argument(
        "--batch-size", type=int, default=64, help="Prompts per step (data.train_batch_size)."
    )
    parser.add_argument(
        "--recipe",
        default="grpo",
        choices=sorted(RECIPES),
        help="grpo (ours) or medexagent (MedExAgent's DAPO run: clip 0.2/0.3, no KL, entropy 0.002, group 16).",
    )
    parser.add_argument(
        "--group-size", type=int, default=None, help="Samples per prompt (rollout.n); grpo 8, medexagent 16."
    )
    parser.add_argument("--epochs", type=int, default=None, help="grpo 3, medexagent 1.")
    parser.add_argument(
        "--rollout",
        default=None,
        choices=["vllm", "sglang"],
        help="Inference engine; grpo vllm, medexagent sglang.",
    )
    parser.add_argument(
        "--tool-config",
        type=Path,
        default=None,
        help="verl tool YAML (default: the bank's environment's tools, written to <data>/verl_tools.yaml).",
    )
    parser.add_argument(
        "--format",
        default="hermes",
        choices=FORMATS,
        help="Tool-call format of the model (multi_turn.format): hermes (JSON in <tool_call>) or qwen3_coder "
        "(Qwen3's XML form, as CASE's released checkpoints write it).",
    )
    parser.add_argument("--experiment", default="case-env-grpo", help="trainer.experiment_name.")
    parser.add_argument(
        "--dry-run", action="store_true", help="Compose and validate the config on CPU, then exit."
    )
    args, extra = parser.parse_known_args(argv)
    group, epochs, engine = RECIPE_DEFAULTS[args.recipe]
    args.group_size = args.group_size or group
    args.epochs = args.epochs or epochs
    args.rollout = args.rollout or engine
    return args, extra


def overrides(args: argparse.Namespace, extra: list[str]) -> list[str]:
    recipe = RECIPES[args.recipe]
    base = [item for item in _base(args) if item.split("=", 1)[0] not in recipe]
    return [*base, *(f"{k}={v}" for k, v in recipe.items()), *extra]


def _base(args: argparse.Namespace) -> list[str]:
    data = args.data.resolve()
    mini_batch = max(1, args.batch_size // 4)
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'val.parquet'}",
        f"data.train_batch_size={args.batch_size}",
        "data.max_prompt_length=6144",
        "data.max_response_length=16384",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.return_raw_chat=True",
        "data.return_multi_modal_inputs=False",
        f"data.custom_cls.path={Path(case_dataset.__file__).resolve()}",
        "data.custom_cls.name=CaseRLHFDataset",
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
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={args.group_size}",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={args.tool_config.resolve()}",
        f"actor_rollout_ref.rollout.multi_turn.format={args.format}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=8",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns=8",
        "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=1",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=2048",
        "actor_rollout_ref.rollout.agent.num_workers=8",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "reward.reward_manager.name=naive",
        f"reward.custom_reward_function.path={Path(case_env.reward.__file__).resolve()}",
        "reward.custom_reward_function.name=compute_score",
        f"trainer.n_gpus_per_node={args.gpus}",
        f"trainer.nnodes={args.nodes}",
        f"trainer.total_epochs={args.epochs}",
        "trainer.project_name=case-env",
        f"trainer.experiment_name={args.experiment}",
        "trainer.logger=[console]",
    ]


def compose(items: list[str]):
    """verl's own ppo_trainer config with our overrides, as main_ppo would see it."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=items)


def check_inputs(args: argparse.Namespace) -> list[str]:
    problems = []
    for name in ("train.parquet", "val.parquet"):
        if not (args.data / name).is_file():
            problems.append(f"{args.data / name} is missing (run `case-env bank build`)")
    if args.tool_config is not None and not args.tool_config.is_file():
        problems.append(f"{args.tool_config} is missing (run `case-env verl-config`)")
    return problems


def bank_tool_config(data: Path) -> Path:
    """The tool YAML of the bank's environment, written beside the bank (always equal to its tools)."""
    envs = {
        registry.for_row(source, {"env": env} if env else None).name
        for env, source in bank_sources(data / "train.parquet")
    }
    if len(envs) != 1:
        raise SystemExit(
            f"error: {data / 'train.parquet'} holds rows of {len(envs)} environments; a run needs one"
        )
    return write(registry.get(envs.pop()), data / "verl_tools.yaml")


def dry_run(args: argparse.Namespace, extra: list[str]) -> int:
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = compose(overrides(args, extra))
    validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    rollout = config.actor_rollout_ref.rollout
    print(OmegaConf.to_yaml(OmegaConf.masked_copy(config, ["algorithm", "reward"])), end="")
    print(
        f"rollout: {rollout.name} n={rollout.n} multi_turn.format={rollout.multi_turn.format} "
        f"multi_turn.tool_config_path={rollout.multi_turn.tool_config_path}"
    )
    print(f"agent loop: {rollout.agent.default_agent_loop}; data: {config.data.train_files}")
    print(f"dry run: config composed and validated ({len(overrides(args, extra))} overrides)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args, extra = parse(sys.argv[1:] if argv is None else argv)
    problems = check_inputs(args)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.tool_config is None:
        args.tool_config = bank_tool_config(args.data.resolve())
    if args.dry_run:
        return dry_run(args, extra)
    server = ensure_server(args.server_url, args.data_root)
    env = {**os.environ, "CASE_ENV_URL": args.server_url}
    try:
        return subprocess.call(
            [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(args, extra)], env=env
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
