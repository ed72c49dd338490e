"""GRPO with multi-turn tools on verl 0.9.1 against a case-env server: scripts/train_grpo.sh runs this.

The options are parsed (`options.py`) and checked, the config composed (`launch.py`), the server found or
started, then `case-env train preflight` (`preflight.py`) checks the run before verl's `main_ppo` starts;
`--dry-run` prints the checks' table last and starts nothing (`--print-config`: the composed config too).
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx

from case_env.server.control import Sizing, ensure_server, is_loopback, stop
from case_env.verl import launch, options


def prepare(argv: list[str], prog: str = "scripts/train_grpo.sh"):
    """Parse the options, check the inputs, choose the chat template and compose verl's config: the run as
    `case-env train preflight` checks it (a `Preflight` whose `config` is composed and validated)."""
    args, extra = options.parse(argv, prog)
    problems = launch.check_inputs(args)
    if problems:
        raise launch.RunRefusedError(problems)
    if args.tool_config is None:
        args.tool_config = launch.bank_tool_config(args.data.resolve(), args.dry_run)
    exposed = not is_loopback(httpx.URL(args.server_url).host) or not is_loopback(args.server_host)
    if exposed and launch.token(args) is None:
        raise launch.RunRefusedError(
            ["a server beyond loopback needs a token: set CASE_ENV_TOKEN or --token-file"]
        )
    from case_env.verl.preflight import Preflight  # imports verl (seconds): after the arguments' checks

    run = Preflight(launch.Plan(args, extra, env_vars=launch.forwarded_env(args, launch.worker_url(args))))
    try:
        run.compose()
    except launch.RunRefusedError:
        raise
    except Exception as exc:  # Hydra's or verl's refusal of an override, in one line
        raise launch.RunRefusedError([f"the config does not compose: {type(exc).__name__}: {exc}"]) from exc
    return run


def main(argv: list[str] | None = None, preflight_only: bool = False) -> int:
    """The run: compose, check (preflight), start verl's main_ppo; `preflight_only` stops after the checks
    (`case-env train preflight`). 0 when it ran (or every check passed), 2 on a refusal."""
    prog = "case-env train preflight" if preflight_only else "scripts/train_grpo.sh"
    try:
        run = prepare(sys.argv[1:] if argv is None else argv, prog)
    except launch.RunRefusedError as refused:
        for problem in refused.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    from case_env.verl.preflight import printable

    plan, args = run.plan, run.args
    if args.dry_run:
        run.check(live=False)
        if args.print_config:
            print(printable(run.config))
        print(
            f"the run: python -m verl.trainer.main_ppo ({len(plan.overrides())} overrides; --print-config shows the config)"
        )
        run.print_table()  # last, where a terminal leaves it in view
        print(
            "dry run: config composed and validated by verl; "
            + ("ready to start" if run.passed else "a check failed, fix it before starting")
        )
        return 0 if run.passed else 2
    server = None
    try:
        server = ensure_server(
            args.server_url,
            args.data_root,
            Sizing.for_concurrency(launch.concurrency(args)),
            args.server_host,
            {"CASE_ENV_TOKEN": launch.token(args)} if launch.token(args) else None,
        )
        if not args.skip_preflight:
            run.check(live=True)
            run.print_table()
            if not run.passed:
                print(
                    "preflight failed: nothing was started (--skip-preflight to run anyway)", file=sys.stderr
                )
                return 2
        if preflight_only:
            return 0
        if not args.no_checkpoints:
            launch.record_identity(args)
        env = {**os.environ, "CASE_ENV_URL": plan.worker_url}
        return subprocess.call([sys.executable, "-m", "verl.trainer.main_ppo", *plan.overrides()], env=env)
    finally:
        stop(server)


if __name__ == "__main__":
    sys.exit(main())
