"""`case-env train preflight`: everything a first GPU run depends on, checked before anything starts.

`scripts/train_grpo.sh` runs it after starting (or finding) the server and before `main_ppo`, and stops when a
check fails (`--skip-preflight` bypasses it); `--dry-run` prints the same table, with the checks that need a
running server and cluster skipped, then the whole composed config. The model's tokenizer and processor come
from a local directory or the Hugging Face cache, never a download (`model_files.py`); without them the
template and length checks read "unverified" and the run is still composed.

The chat template is chosen here, because only the model's files tell whether its own renders tools:
`--chat-template auto` keeps the model's own when a rehearsed episode (`rehearsal.py`) passes, else takes
case-env's template of the model's family (`chat_templates/`) when it teaches the run's call format, and
without the files takes case-env's for a family whose published processor template has no tools (Qwen2.5-VL).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

from case_env.core import registry
from case_env.lm.chat_templates import family_for, template
from case_env.verl import checks, launch, model_files
from case_env.verl.checks import FAIL, Check
from case_env.verl.options import TEMPLATE_CHOICES, recipes

# families whose published (processor) template renders no tools: case-env's is used even unverified
TOOLLESS = ("qwen2_5_vl",)


class Preflight:
    def __init__(self, plan: launch.Plan):
        self.plan = plan
        self.args: SimpleNamespace = plan.args
        self.results: list[Check] = []
        self.config: Any = None
        self.files: model_files.ModelFiles | None = None

    @property
    def passed(self) -> bool:
        return all(c.status != FAIL for c in self.results)

    def compose(self) -> Any:
        """Load the model's files when they are here, choose the chat template, compose and validate."""
        args = self.args
        self.envs = launch.bank_envs(args.data.resolve())
        directory = model_files.local_model_dir(args.model)
        self.files = model_files.load(directory) if directory is not None else None
        with checks.quiet():
            self.datasets = {split: self._dataset(split) for split in ("train", "val")}
            from verl.tools.tool_registry import load_all_tools

            tools = load_all_tools(tool_config_path=str(args.tool_config), function_tool_path=None)
        self.schemas = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools]
        self.rows = self._first_rows()
        images = "CASE_ENV_TOOL_IMAGES"
        if self.files is not None and self.files.processor is None and images not in self.plan.env_vars:
            # a text model: verl raises on a tool's image ("Multimedia data can only be processed by
            # processor") and its trainer drops the trajectory, so the tools answer it in text
            self.plan.env_vars[images] = "false"
        self.config = launch.compose(self.plan.overrides())
        if len(self.envs) > 1 and not self.config.trainer.use_v1:
            raise launch.RunRefusedError(
                [
                    f"a bank of several environments ({', '.join(self.envs)}) needs verl's V1 trainer "
                    "(trainer.use_v1=True, its default): the legacy one reads every row's reward keys from the "
                    "batch's first row"
                ]
            )
        self._choose_template()
        if self.plan.chat_template is not None:
            self.config = launch.compose(self.plan.overrides())
        launch.validate(self.config)
        if self.files is not None:
            self.files.use_template(self.plan.chat_template)
        return self.config

    def _dataset(self, split: str):
        from case_env.verl.dataset import CaseRLHFDataset
        from case_env.verl.offline import build_tokenizer

        data = OmegaConf.create(
            {
                "prompt_key": "prompt",
                "filter_overlong_prompts": False,
                "tool_config_path": str(self.args.tool_config),
            }
        )
        tokenizer = self.files.tokenizer if self.files else build_tokenizer()
        processor = self.files.processor if self.files else None
        path = self.args.data.resolve() / f"{split}.parquet"
        return CaseRLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=data, processor=processor)

    def _first_rows(self) -> dict[str, dict]:
        """One row of each data source of the train split, as RLHFDataset yields it to the agent loop."""
        dataset, rows = self.datasets["train"], {}
        for index, source in enumerate(dataset.raw_rows()["data_source"]):
            if source not in rows:
                rows[source] = dataset[index]
        return rows

    def _choose_template(self) -> None:
        args, plan = self.args, self.plan
        files = self.files
        vocabulary = files.tokenizer.get_vocab() if files else ()
        family = family_for(files.model_type if files else None, args.model, vocabulary)
        shipped = template(family) if family is not None else None
        if args.chat_template == "model":
            return
        if args.chat_template == "shipped":
            if shipped is None:
                raise launch.RunRefusedError(
                    [f"case-env ships no chat template for {args.model}; pass a file"]
                )
            plan.chat_template, plan.template_origin = shipped, f"case-env's {family.name} template"
            return
        if args.chat_template not in TEMPLATE_CHOICES:
            plan.chat_template = Path(args.chat_template).read_text(encoding="utf-8")
            plan.template_origin = f"the template of {args.chat_template}"
            return
        fits = family is not None and family.call_format == args.format
        if self.files is None:
            if fits and family.name in TOOLLESS:
                plan.chat_template = shipped
                plan.template_origin = (
                    f"case-env's {family.name} template (the published one renders no tools)"
                )
            return
        own = "the model's processor template" if self.files.processor is not None else "the model's template"
        plan.template_origin = own
        item = next(iter(self.rows.values()))
        problems = checks.template_problems(
            self.files, self.config, item, self.schemas, checks.offered_tools(item, self.schemas)
        )
        if problems and fits:
            plan.chat_template = shipped
            plan.template_origin = f"case-env's {family.name} template, chosen because {own} {problems[0]}"

    def check(self, live: bool) -> list[Check]:
        """Every check; `live` ones call the running server and every node of the Ray cluster."""
        args, config = self.args, self.config
        plan = self.plan
        measured = checks.Measured.of(self.datasets) if self.files is not None else None
        train_rows = len(self.datasets["train"])
        fitting = ""
        if measured is not None:  # verl's length filter runs before its loader counts batches
            train_rows = measured.fitting("train", int(config.data.max_prompt_length))
            fitting = " fitting data.max_prompt_length"
        results = [
            checks.chat_template(
                self.files, config, self.rows, self.schemas, plan.template_origin, args.model
            ),
            checks.prompt_lengths(config, measured),
        ]
        token = launch.token(args)
        reports = None
        if live:
            results.append(checks.served_tools(args.server_url, token, self.envs, self.schemas))
            reports = self._probe()
        else:
            results.append(Check("served tools", checks.SKIPPED, "a dry run starts and asks no server"))
        results.append(checks.nodes(reports, plan.worker_url, args.nodes, plan.env_vars))
        results.append(checks.tool_images(self.files, self.rows, self.schemas, plan.env_vars))
        results.append(checks.batches(config, train_rows, fitting))
        results.append(checks.checkpoints(config, train_rows, args.no_checkpoints, launch.run_identity(args)))
        results.append(checks.logged(config))
        results.append(checks.rollout_engine(config))
        results.append(checks.gpus(reports, args.gpus, args.nodes))
        results.append(checks.episode_ids(config))
        results.append(checks.distillation(config, self.datasets["train"]))
        weights = recipes()[args.recipe].reward_weights
        results.append(
            checks.worst(
                [
                    checks.judge(registry.get(env), plan.env_vars, live, args.nodes, weights)
                    for env in self.envs
                ]
            )
        )
        self.results = results
        return results

    def _probe(self):
        from case_env.verl import rehearsal
        from case_env.verl.cluster import probe_nodes

        item = next(iter(self.rows.values()))
        # the offered tool with the fewest required arguments: the call most likely to succeed as written
        tool = min(checks.offered_tools(item, self.schemas), key=lambda s: len(rehearsal.arguments_for(s)))
        name = tool["function"]["name"]
        create_kwargs = (item["tools_kwargs"].get(name) or {}).get("create_kwargs") or {}
        config, tool_yaml = self.config, str(self.args.tool_config.resolve())
        paths = [
            *_files(config.data.train_files),
            *_files(config.data.val_files),
            tool_yaml,
            config.reward.custom_reward_function.path,
            config.data.custom_cls.path,
            *_files(config.actor_rollout_ref.rollout.agent.agent_loop_config_path),
            *([str(self.args.token_file.resolve())] if self.args.token_file else []),
        ]
        address = OmegaConf.select(config, "ray_kwargs.ray_init.address")
        arguments = rehearsal.arguments_for(tool)
        return probe_nodes(
            address, self.plan.env_vars, paths, tool_yaml, name, dict(create_kwargs), arguments
        )

    def print_table(self) -> None:
        """One line per check: its status, what was seen, and for a failure the fix."""
        width = max(len(c.name) for c in self.results)
        print(f"preflight: {self.args.model} on {self.args.data} ({self.args.recipe} recipe)")
        for c in self.results:
            fix = f" -- fix: {c.fix}" if c.fix and c.status != checks.PASS else ""
            print(f"  {c.status:<10} {c.name:<{width}}  {c.detail}{fix}")
        failed = sum(c.status == FAIL for c in self.results)
        summary = (
            f"{len(self.results) - failed} of {len(self.results)} checks pass or are not verifiable here"
        )
        print(f"preflight: {summary}" + (f"; {failed} failed" if failed else ""))


def _files(value: Any) -> list[str]:
    """A data.*_files value (one path, a comma-separated string or a list) as paths; none for null."""
    if value is None:
        return []
    return value.split(",") if isinstance(value, str) else [str(v) for v in value]


def printable(config: Any) -> str:
    return checks.masked(config)
