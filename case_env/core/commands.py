"""One style for every command line of the project (`case-env`, the launchers, the scripts): typer, plain help.

Rich's help mode reads `[default: ...]` in a help text as markup and drops it, and shows flags as `<bool>`.
"""

from collections.abc import Callable
from typing import Any

import typer


def plain_app(**settings: Any) -> typer.Typer:
    """A typer app with case-env's settings: plain help, no shell completion, no pretty tracebacks."""
    return typer.Typer(
        add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None, **settings
    )


def run(function: Callable[..., Any]) -> None:
    """Run `function` as a script's one command (typer's `typer.run`, in the plain style)."""
    app = plain_app()
    app.command()(function)
    app()
