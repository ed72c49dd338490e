"""The launchers' options as typer commands, the command line's framework: scripts/train_grpo.sh and
`case-env train run|preflight` (`parse`), scripts/train_sft.sh (`case_env.verl.sft`).

Each launcher reads its options and hands the rest (verl's `key=value` Hydra overrides) to verl; an unknown
`--option` is refused, since verl takes none. The recipes' defaults fill what was not given.
"""

import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal

import typer

from case_env.core import registry
from case_env.core.calls import FORMATS
from case_env.core.commands import plain_app
from case_env.core.parts import Recipe, Training

# A recipe is the overrides that differ from the base recipe (`grpo`, ours); environments add their own
# (`case_env.core.parts.Training`).
BASE = Recipe({}, group_size=8, epochs=3, rollout="vllm", summary="ours")
TEMPLATE_CHOICES = ("auto", "model", "shipped")
REWARD_MANAGERS = ("auto", "naive", "rate_limited")
MAX_FAILED_ROLLOUTS = 0.05  # ours: a few percent (case_env/verl/loop.py reads the same default)
JUDGE_CONCURRENCY = 256  # ours: about what one vLLM judge server batches at once (its --max-num-seqs)
# ours: one teacher replica per node at verl's default tensor parallelism (2), an 8B model in BF16 with room
# for its KV cache at verl's 0.5 memory share
TEACHER_GPUS = 2
ENGINES = ("vllm", "sglang")
# the options the preflight alone does not take: it skips nothing and starts nothing to dry-run
START_ONLY = ("skip_preflight", "dry_run", "print_config")


def recipes() -> dict[str, Recipe]:
    """Every recipe: the base one, then each environment's."""
    found = {"grpo": BASE}
    for env in registry.environments().values():
        if isinstance(env, Training):
            found.update(env.recipes)
    return found


def command(options, drop: tuple[str, ...] = ()):
    """The click command typer makes of the function `options` (less its parameters named in `drop`), taking
    unknown arguments as verl's overrides."""
    app = plain_app()
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(options)
    made = typer.main.get_command(app)
    made.params = [p for p in made.params if p.name not in drop]
    return made


def read(launcher, argv: list[str], prog: str) -> tuple[SimpleNamespace, list[str]]:
    """`argv` read by the command `launcher`: the options given, and the Hydra overrides left for verl.
    `--help` prints the help and exits 0; a wrong option names itself and exits 2, as every command of
    `case-env` does."""
    try:
        with launcher.make_context(prog, list(argv)) as context:
            unknown = [a for a in context.args if a.startswith("-")]
            if unknown:  # the rest go to Hydra, whose overrides are key=value: an option here is a mistake
                context.fail(
                    f"unknown option(s) {' '.join(unknown)} (see --help; verl's settings go as key=value)"
                )
            return SimpleNamespace(**context.params), list(context.args)
    except typer.Exit as done:  # --help
        raise SystemExit(done.exit_code) from None
    except typer.TyperException as wrong:  # click's usage errors, vendored by typer
        wrong.show()
        raise SystemExit(wrong.exit_code) from None


def parse(argv: list[str], prog: str = "scripts/train_grpo.sh") -> tuple[SimpleNamespace, list[str]]:
    """The GRPO launcher's options, the recipe's defaults filled in, and verl's overrides."""
    known = recipes()
    args, extra = read(grpo_command(known, preflight=prog.endswith("preflight")), argv, prog)
    for name in START_ONLY:
        args.__dict__.setdefault(name, False)
    recipe = known[args.recipe]
    args.group_size = args.group_size or recipe.group_size
    args.epochs = args.epochs or recipe.epochs
    args.rollout = args.rollout or installed_engine(recipe.rollout)
    args.opsd = recipe.opsd if args.opsd is None else args.opsd
    args.teacher_model = args.teacher_model or args.model
    if args.teacher_gpus is None:
        args.teacher_gpus = teacher_gpus(args, recipe.updates_per_step)
    args.experiment = args.experiment or default_experiment(args.recipe, args.model, args.data)
    args.checkpoint_dir = (
        args.checkpoint_dir or Path("checkpoints") / "case-env" / args.experiment
    ).resolve()
    return args, extra


def unpadded(batch: int, group: int, updates: int, world: int) -> bool:
    """Whether verl's V1 trainer takes a step of `batch` prompts x `group` on `world` student GPUs unpadded:
    it pads to a multiple of lcm(data-parallel size, the mini-batch in sequences) (`_get_required_batch_multiple`,
    trainer/ppo/v1/trainer_base.py)."""
    mini = max(1, batch // updates) * group
    return (batch * group) % math.lcm(world, mini) == 0


def teacher_gpus(args: SimpleNamespace, updates: int) -> int:
    """OPSD's teacher GPUs per node when none are given: the fewest, from 2 (tensor parallel 2) up, then odd
    counts, that leave the student a count its step needs no padding on; else 2."""
    for teacher in [*range(TEACHER_GPUS, args.gpus, 2), *range(1, args.gpus, 2)]:
        if unpadded(args.batch_size, args.group_size, updates, (args.gpus - teacher) * args.nodes):
            return teacher
    return TEACHER_GPUS


def default_experiment(recipe: str, model: str, data: Path) -> str:
    """case-env-<recipe>-<model>-<bank>: another model or bank under the same recipe gets its own checkpoint
    directory, so it never resumes another run's weights."""
    name = Path(str(model).rstrip("/")).name or "model"
    bank = data.resolve().name or "bank"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"case-env-{recipe}-{name}-{bank}")


def grpo_command(known: dict[str, Recipe], preflight: bool = False):
    """The GRPO launcher's command; the preflight's lacks the options that start a run."""
    return command(_launcher(known), START_ONLY if preflight else ())


def installed_engine(preferred: str) -> str:
    """The recipe's inference engine when it is installed here, else the other one that is (a venv of `make
    train-env` holds one of them), else the recipe's (a CPU machine composing a run)."""
    import importlib.util

    for engine in (preferred, *(e for e in ENGINES if e != preferred)):
        if importlib.util.find_spec(engine) is not None:
            return engine
    return preferred


def _each(known: dict[str, Recipe], value) -> str:
    return ", ".join(f"{name} {value(recipe)}" for name, recipe in known.items())


# Each option's help, by its name (`--name`, `_` read as `-`); the recipes' defaults are added per run.
HELP = {
    "model": "Model path or Hugging Face id (a VL model: tools return images).",
    "data": "Bank directory with train.parquet and val.parquet.",
    "server_url": "case-env server URL.",
    "server_host": "Bind address of a server the launcher starts (when none answers at --server-url). Another "
    "address than loopback needs CASE_ENV_TOKEN, and workers then call this node's address.",
    "token_file": "File holding the server's token, readable at the same path on every node. Workers get the "
    "path (CASE_ENV_TOKEN_FILE) instead of the token, which would otherwise sit in the config verl prints "
    "[default: CASE_ENV_TOKEN].",
    "gpus": "GPUs per node.",
    "nodes": "Nodes.",
    "data_root": "Data root for the server started when none answers at --server-url.",
    "batch_size": "Prompts per step (data.train_batch_size).",
    "tool_config": "verl tool YAML [default: the bank's environment's tools, written to <data>/verl_tools.yaml].",
    "format": "Tool-call format the model writes (multi_turn.format): hermes, JSON inside <tool_call> (Qwen2.5, "
    "Qwen2.5-VL, Qwen3, Qwen3-VL); qwen3_coder, XML inside <tool_call> (Qwen3-Coder, Qwen3.5).",
    "chat_template": "auto: the model's own template when it renders tools, else case-env's for its family; "
    "model: the model's own; shipped: case-env's for the family (Qwen2.5-VL, Qwen3-VL, Qwen3); or a Jinja file.",
    "checkpoint_dir": "trainer.default_local_dir [default: checkpoints/case-env/<experiment> under this "
    "directory].",
    "no_checkpoints": "Run without saving checkpoints (trainer.save_freq=-1); preflight refuses such a run "
    "otherwise.",
    "max_failed_rollouts": "Stop the run when more than this share of a rollout worker's recent trajectories "
    "failed for the infrastructure (the server unreachable, a 5xx or timeout after retries, a loop that raised); "
    "such trajectories are kept out of the gradient below it. 1 never stops.",
    "experiment": "trainer.experiment_name [default: case-env-<recipe>-<model>-<bank directory>].",
    "reward_manager": "verl's reward manager. auto: rate_limited when the bank's rewards ask a judge and "
    "CASE_ENV_JUDGE_URL is set, else naive.",
    "judge_concurrency": "Rewards scored at once over all of verl's reward workers (rate_limited; about what one "
    "vLLM judge server batches at once: set its --max-num-seqs).",
    "judge_rpm": "Judge requests per minute (rate_limited) [default: no limit].",
    "judge_tpm": "Judge tokens per minute (rate_limited) [default: no limit].",
    "teacher_model": "The OPSD teacher [default: --model, the initial checkpoint: self-distillation].",
    "teacher_gpus": "GPUs per node serving the OPSD teacher, taken from --gpus [default: the fewest, from 2 up, "
    "that leave the student a count its step needs no padding on; else 2].",
    "skip_preflight": "Start the run without `case-env train preflight`.",
    "dry_run": "Compose the config, validate it with verl and print the preflight table and the main_ppo "
    "command; start and write nothing (exit 2 when a check fails).",
    "print_config": "With --dry-run: also print the whole composed config (about a thousand lines).",
}


def _recipe_help(known: dict[str, Recipe]) -> dict[str, str]:
    """The help of the options whose defaults are the recipe's."""
    return {
        "recipe": "; ".join(f"{name} ({r.summary})" for name, r in known.items()) + ".",
        "group_size": f"Samples per prompt (rollout.n) [default: the recipe's: {_each(known, lambda r: r.group_size)}].",
        "epochs": f"Epochs [default: the recipe's: {_each(known, lambda r: r.epochs)}].",
        "rollout": f"Inference engine [default: the recipe's ({_each(known, lambda r: r.rollout)}) when installed, "
        "else the installed one].",
        "opsd": "On-policy self-distillation: a teacher reading each row's prompt with its teacher_insight scores "
        "the student's own tokens (verl's distillation loss beside GRPO) [default: the recipe's: "
        f"{_each(known, lambda r: 'on' if r.opsd else 'off')}].",
    }


def _launcher(known: dict[str, Recipe]):
    """The launcher's options as one typer function."""
    helps = {**HELP, **_recipe_help(known)}

    def option(name: str, *flags: str, **settings: Any) -> Any:
        return typer.Option(*(flags or [f"--{name.replace('_', '-')}"]), help=helps[name], **settings)

    def launcher(
        model: Annotated[str, option("model")],
        data: Annotated[Path, option("data")],
        server_url: Annotated[str, option("server_url")] = "http://127.0.0.1:8000",
        server_host: Annotated[str, option("server_host")] = "127.0.0.1",
        token_file: Annotated[Path | None, option("token_file")] = None,
        gpus: Annotated[int, option("gpus")] = 8,
        nodes: Annotated[int, option("nodes")] = 1,
        data_root: Annotated[Path, option("data_root")] = Path("data/synthetic"),
        batch_size: Annotated[int, option("batch_size")] = 64,
        recipe: Annotated[Literal[tuple(sorted(known))], option("recipe")] = "grpo",
        group_size: Annotated[int | None, option("group_size")] = None,
        epochs: Annotated[int | None, option("epochs")] = None,
        rollout: Annotated[Literal[ENGINES] | None, option("rollout")] = None,
        tool_config: Annotated[Path | None, option("tool_config")] = None,
        format: Annotated[Literal[FORMATS], option("format")] = "hermes",
        chat_template: Annotated[str, option("chat_template")] = "auto",
        checkpoint_dir: Annotated[Path | None, option("checkpoint_dir")] = None,
        no_checkpoints: Annotated[bool, option("no_checkpoints")] = False,
        max_failed_rollouts: Annotated[
            float, option("max_failed_rollouts", min=0.0, max=1.0)
        ] = MAX_FAILED_ROLLOUTS,
        experiment: Annotated[str | None, option("experiment")] = None,
        reward_manager: Annotated[Literal[REWARD_MANAGERS], option("reward_manager")] = "auto",
        judge_concurrency: Annotated[int, option("judge_concurrency")] = JUDGE_CONCURRENCY,
        judge_rpm: Annotated[int | None, option("judge_rpm")] = None,
        judge_tpm: Annotated[int | None, option("judge_tpm")] = None,
        opsd: Annotated[bool | None, option("opsd", "--opsd/--no-opsd", show_default=False)] = None,
        teacher_model: Annotated[str | None, option("teacher_model")] = None,
        teacher_gpus: Annotated[int | None, option("teacher_gpus")] = None,
        skip_preflight: Annotated[bool, option("skip_preflight")] = False,
        dry_run: Annotated[bool, option("dry_run")] = False,
        print_config: Annotated[bool, option("print_config")] = False,
    ) -> None:
        """GRPO with multi-turn tools on verl 0.9.1 against a case-env server."""

    return launcher
