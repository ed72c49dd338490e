"""The supervised stage before RL on verl 0.9.1's SFT trainer (used by scripts/train_sft.sh).

`--recipe NAME` is an environment's SFT recipe (`case_env.core.parts.Training.sft_recipes`). `--data` is a
conversation file in any of the shapes this project meets: records with a `conversation` in the OpenAI chat
format (a published system's SFT file), a CASE trajectory JSONL or an eval run's folder (`messages`), or the
parquet `case-env traj to-sft` writes. Its conversations become a parquet of `messages` beside the input,
written as the recipe says (`tools_as_text`: tool calls as `<tool_call>` text in the assistant turn, tool
results as user turns, no tool schemas), which verl's MultiTurnSFTDataset trains on with the loss on
assistant tokens only.

The config is verl's `sft_trainer_engine` with the recipe's overrides, then the user's. `--dry-run` composes
it, converts every section verl's SFTTrainer converts (the model's only when the model is a local directory),
builds verl's dataset over the converted rows with the model's tokenizer and prints what it found; nothing
starts. Otherwise verl's trainer starts under torchrun (`python -m torch.distributed.run`).
"""

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Literal

import pyarrow as pa
import pyarrow.parquet as pq
import typer

from case_env.core import registry
from case_env.core.calls import chat_call
from case_env.core.parts import SFTRecipe, Training
from case_env.core.sft_data import sft_rows
from case_env.verl import launch
from case_env.verl.options import command, read


def sft_recipes() -> dict[str, SFTRecipe]:
    found: dict[str, SFTRecipe] = {}
    for env in registry.environments().values():
        if isinstance(env, Training):
            found.update(env.sft_recipes)
    return found


def parse(argv: list[str]) -> tuple[SimpleNamespace, list[str]]:
    """The SFT launcher's options and verl's overrides."""
    return read(sft_command(sft_recipes()), argv, "scripts/train_sft.sh")


def sft_command(known: dict[str, SFTRecipe]):
    """The SFT launcher's command."""
    Recipe = Annotated[
        Literal[tuple(sorted(known))],
        typer.Option(
            "--recipe",
            help="; ".join(f"{name}: {recipe.summary}" for name, recipe in sorted(known.items())),
        ),
    ]

    def launcher(
        recipe: Recipe,
        model: Annotated[str, typer.Option(help="The model to fine-tune (a path or a Hugging Face id).")],
        data: Annotated[Path, typer.Option(help="Conversations: JSONL, an eval folder, or parquet.")],
        val: Annotated[
            Path | None, typer.Option(help="Validation conversations, the same shapes [default: none].")
        ] = None,
        gpus: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
        nodes: Annotated[int, typer.Option(help="Nodes.")] = 1,
        checkpoint_dir: Annotated[Path, typer.Option(help="trainer.default_local_dir.")] = Path(
            "checkpoints/sft"
        ),
        experiment: Annotated[str, typer.Option(help="trainer.experiment_name.")] = "sft",
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Compose, convert and check; start nothing.")
        ] = False,
    ) -> None:
        """The supervised stage before RL on verl 0.9.1's SFT trainer."""

    return command(launcher)


def conversations(source: Path) -> Iterator[list[dict]]:
    """Every conversation of `source`, in the chat format, whoever wrote it."""
    if source.suffix == ".parquet":
        for row in pq.read_table(source).to_pylist():
            yield list(row["messages"])
        return
    if source.is_file() and source.suffix == ".jsonl":
        with source.open(encoding="utf-8") as handle:
            first = next((json.loads(line) for line in handle if line.strip()), {})
        if isinstance(first.get("conversation"), list):  # records of a published system's SFT file
            with source.open(encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        yield list(json.loads(line)["conversation"])
            return
    for row in sft_rows(source, correct_only=False):  # CASE trajectories
        yield row["messages"]


def tools_as_text(messages: list[dict]) -> list[dict]:
    """Tool calls as text: an assistant turn's calls as `<tool_call>` blocks after its text, a tool result as
    a user turn, so the conversation is system/user/assistant only (for templates and recipes without tool
    messages)."""
    out = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            parts = [message["content"]] if message.get("content") else []
            for call in message["tool_calls"]:
                name, arguments = chat_call(call)
                body = json.dumps({"name": name, "arguments": {} if arguments is None else arguments})
                parts.append(f"<tool_call>\n{body}\n</tool_call>")
            out.append({"role": "assistant", "content": "\n\n".join(parts)})
        elif message.get("role") == "tool":
            out.append({"role": "user", "content": str(message.get("content") or "")})
        else:
            out.append({"role": str(message.get("role")), "content": str(message.get("content") or "")})
    return out


def convert(source: Path, recipe: SFTRecipe) -> tuple[Path, int]:
    """The verl SFT parquet of `source`'s conversations, written beside it: (path, rows)."""
    rows = [
        {"messages": tools_as_text(c) if recipe.tools_as_text else c}
        for c in conversations(source)
        if any(m.get("role") == "assistant" for m in c)
    ]
    if not rows:
        raise ValueError(f"{source} holds no conversation with an assistant turn")
    base = source if source.is_dir() else source.with_suffix("")
    out = (
        base.parent / f"{base.name}.verl_sft.parquet" if not source.is_dir() else source / "verl_sft.parquet"
    )
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out, len(rows)


def overrides(args: SimpleNamespace, recipe: SFTRecipe, train: Path, val: Path | None) -> list[str]:
    world = args.gpus * args.nodes
    items = [
        f"model.path={args.model}",
        f"data.train_files={train.resolve()}",
        f"data.val_files={val.resolve() if val else 'null'}",
        "data.messages_key=messages",
        f"data.train_batch_size={recipe.sequences_per_gpu * world}",
        f"trainer.n_gpus_per_node={args.gpus}",
        f"trainer.nnodes={args.nodes}",
        f"trainer.default_local_dir={args.checkpoint_dir}",
        "trainer.project_name=case-env",
        f"trainer.experiment_name={args.experiment}",
        "trainer.logger=[console]",
        *(f"{k}={v}" for k, v in recipe.overrides.items()),
    ]
    return items


def compose(items: list[str]):
    """verl's `sft_trainer_engine` config with our overrides."""
    return launch.compose(items, "sft_trainer_engine")


def check(config, model_is_local: bool) -> list[str]:
    """What verl's SFTTrainer converts before it touches a GPU, and its dataset over the rows."""
    from verl.utils.config import omega_conf_to_dataclass

    for section in ("engine", "optim", "checkpoint", "profiler"):
        omega_conf_to_dataclass(config[section])
    if not model_is_local:
        return [f"model {config.model.path} is not a local directory: its tokenizer and dataset not checked"]
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    model = omega_conf_to_dataclass(config.model)
    data = MultiTurnSFTDataset(
        parquet_files=[config.data.train_files], tokenizer=model.tokenizer, config=config.data, processor=None
    )
    lengths, trained = [], 0
    for i in range(len(data)):
        item = data[i]
        lengths.append(int(item["input_ids"].shape[-1]))
        trained += int(item["loss_mask"].sum())
    return [
        f"{len(data)} conversations through verl's MultiTurnSFTDataset: longest {max(lengths)} tokens "
        f"(max_length {config.data.max_length}), {trained} of {sum(lengths)} tokens trained (assistant turns)"
    ]


def main(argv: list[str] | None = None) -> int:
    args, extra = parse(sys.argv[1:] if argv is None else argv)
    recipe = sft_recipes()[args.recipe]
    try:
        train, n = convert(args.data, recipe)
        val = convert(args.val, recipe)[0] if args.val else None
        config = compose([*overrides(args, recipe, train, val), *extra])
        notes = check(config, Path(args.model).is_dir()) if args.dry_run else []
    except (FileNotFoundError, ValueError, KeyError, AssertionError) as exc:
        # verl's dataset asserts that a conversation rendered turn by turn equals it rendered whole (Qwen3's
        # template adds <think> tags to the last turn only); its message says which option accepts that
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {n} conversations to {train}")
    if args.dry_run:
        from omegaconf import OmegaConf

        for note in notes:
            print(note)
        print(OmegaConf.to_yaml(config))
        print("dry run: SFT config composed and validated")
        return 0
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={args.nodes}"]
    command += [f"--nproc_per_node={args.gpus}", "-m", "verl.trainer.sft_trainer"]
    return subprocess.call([*command, *overrides(args, recipe, train, val), *extra])


if __name__ == "__main__":
    sys.exit(main())
