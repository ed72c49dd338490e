"""`case-env version` and `case-env envs`: what is installed."""

from __future__ import annotations

import json

import typer

from case_env import __version__
from case_env.cli.groups import app
from case_env.core import registry
from case_env.core.parts import evaluation_of


@app.command()
def version() -> None:
    """Print the package version."""
    typer.echo(__version__)


@app.command()
def envs(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON document."),
    verbose: bool = typer.Option(False, "--verbose", help="Also the optional parts each environment has."),
) -> None:
    """List every registered environment: its personas (with their data sources) and tools."""
    listed = {
        env.name: {
            "title": env.title,
            "summary": env.summary,
            "personas": {name: list(p.data_sources) for name, p in env.personas.items()},
            "tools": list(env.tools),
            "data_sources": list(env.personas.data_sources),
            "agents": list(evaluation_of(env).baselines),
            "reward": {c.name: {"weight": c.weight, "about": c.about} for c in env.components},
            "parts": [part.__name__ for part in registry.PARTS if isinstance(env, part)],
            "protocols": list(evaluation_of(env).protocols),
            "default": env.default,
        }
        for env in registry.environments().values()
    }
    if as_json:
        typer.echo(json.dumps({"environments": listed, "problems": list(registry.problems())}, indent=2))
        return
    import textwrap

    def field(label: str, text: str) -> None:
        typer.echo(textwrap.fill(text, 100, initial_indent=f"  {label}: ", subsequent_indent="    "))

    for name, env in listed.items():
        typer.echo(textwrap.fill(f"{name}{' (default)' if env['default'] else ''}: {env['summary']}", 100))
        field("personas", ", ".join(f"{p} ({', '.join(s)})" for p, s in env["personas"].items()))
        field(f"tools ({len(env['tools'])})", ", ".join(env["tools"]))
        field("scripted agents", ", ".join(env["agents"]) or "-")
        terms = [(c["weight"], name) for name, c in env["reward"].items()]
        weights = "".join(
            f"{' - ' if w < 0 else ' + ' if i else ''}{abs(w):g} {name}" for i, (w, name) in enumerate(terms)
        )
        field("reward", f"score = {weights} (defaults; a row's reward_weights set its own)" if terms else "-")
        if verbose:
            for component, c in env["reward"].items():
                field(f"  {component}", c["about"])
            field("parts", ", ".join(env["parts"]) or "-")
        if env["protocols"]:
            field("eval protocols", f"{', '.join(env['protocols'])} (the first the default)")
    for problem in registry.problems():
        typer.echo(f"problem: {problem}", err=True)
