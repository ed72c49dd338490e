"""The `case-env` command line.

Every verb works on any registered environment (`case-env envs` lists them); what differs between
environments comes from their option models and hooks, and each may add its own commands (under
`case-env bench`, say). Expected failures (bad data, a directory we must not
overwrite, an unknown option value) print one clear line per problem and exit non-zero; anything
unexpected prints a one-line internal error instead of a traceback, unless CASE_ENV_DEBUG=1 asks for it.
"""

from __future__ import annotations

import os
import sys

import typer

from case_env.cli.groups import GROUPS, app
from case_env.core import registry
from case_env.core.errors import CommandError
from case_env.core.parts import Commands

# isort: off
# each module registers its commands on the groups, in the order `case-env --help` lists them
from case_env.cli import about, data, serve, run, bench  # noqa: F401
# isort: on

for _env in registry.environments().values():
    if isinstance(_env, Commands):
        _env.cli(GROUPS)


def main() -> None:
    try:
        app()
    except CommandError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("CASE_ENV_DEBUG") == "1":
            raise
        typer.echo(
            f"internal error: {type(exc).__name__}: {exc} (set CASE_ENV_DEBUG=1 for a traceback)", err=True
        )
        sys.exit(70)


if __name__ == "__main__":
    main()
