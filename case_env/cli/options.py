"""Command options from the environments' option models: `case-env synth` and `case-env bank build` take every
registered environment's options, each spelled as its field (`patient_noise` is `--patient-noise`).

Every option defaults to "not given", so the chosen environment's model supplies its own defaults and
validates what was given; an option of another environment is refused by name. A new environment's options
appear here without a change to the command line.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from case_env.core import registry
from case_env.core.errors import CommandError

_CLICK_TYPES = (int, float, str, bool, Path)


def _click_type(annotation: Any) -> Any:
    """The option type click reads; what it cannot (Literal, tuple) it reads as text for the model."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _click_type(options[0]) if len(options) == 1 else str
    if origin is list:
        return list[_click_type(typing.get_args(annotation)[0])]
    return annotation if annotation in _CLICK_TYPES else str


def _fields(models: dict[str, type[BaseModel]]) -> dict[str, tuple[Any, str, list[str], dict[str, str]]]:
    """name -> (click type, help, environments taking it, each one's default as shown), over every
    environment's model."""
    out: dict[str, tuple[Any, str, list[str], dict[str, str]]] = {}
    for env, model in models.items():
        for name, field in model.model_fields.items():
            kind, described, takers, defaults = out.get(
                name, (_click_type(field.annotation), field.description or "", [], {})
            )
            if takers and field.description and field.description not in described:
                # the same option meaning other things in other environments: each one's sense, named
                first = described if described.startswith(f"{takers[0]}: ") else f"{takers[0]}: {described}"
                described = f"{first.rstrip('.')}; {env}: {field.description}"
            default = field.get_default(call_default_factory=True)
            if default is not PydanticUndefined:
                defaults = {**defaults, env: _shown(default)}
            out[name] = (kind, described, [*takers, env], defaults)
    return out


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value) or "none"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _default_text(defaults: dict[str, str]) -> str:
    """`[default: 10]`, or each environment's when they differ (`[default: first 20, second 10]`)."""
    if not defaults:
        return " [required]"
    if len(set(defaults.values())) == 1:
        return f" [default: {next(iter(defaults.values()))}]"
    return " [default: " + ", ".join(f"{env} {value}" for env, value in sorted(defaults.items())) + "]"


def describe_error(exc: ValidationError) -> str:
    """The model's complaints as option names and what is wrong with each."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"])
        if error["type"] == "literal_error":
            parts.append(f"unknown {field} {error['input']!r}; choose {error['ctx']['expected']}")
        else:
            message = error["msg"].removeprefix("Value error, ")  # a validator's own words, as written
            parts.append(f"--{field.replace('_', '-')}: {message}")
    return "; ".join(parts)


def options_command(
    group: typer.Typer,
    name: str,
    summary: str,
    has: tuple[Callable[[Any], bool], str],
    model_of: Callable[[Any], type[BaseModel]],
    run: Callable[[Any, BaseModel], None],
) -> None:
    """Register `name` on `group`: `--env` plus the options of every environment that `has` what the command
    needs (a test, and its name), validated by the chosen environment's model."""
    able, needs = has
    envs = {n: e for n, e in registry.environments().items() if able(e)}
    models = {env.name: model_of(env) for env in envs.values()}
    fields = _fields(models)
    everyone = set(envs)
    params = [
        inspect.Parameter(
            "env",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(
                None, "--env", help=f"The environment: {', '.join(envs)} (default: the default one)."
            ),
            annotation=str | None,
        )
    ]
    for field, (kind, described, takers, defaults) in fields.items():
        scope = "" if set(takers) == everyone else f" [{', '.join(takers)}]"
        shown = described + scope + _default_text(defaults)
        params.append(
            inspect.Parameter(
                field,
                inspect.Parameter.KEYWORD_ONLY,
                default=typer.Option(None, f"--{field.replace('_', '-')}", help=shown),
                annotation=kind | None,
            )
        )

    def command(**given: Any) -> None:
        chosen = given.pop("env", None)
        try:
            env = registry.get(chosen) if chosen else registry.default()
        except registry.RegistryError as exc:
            raise CommandError(str(exc), 2) from None
        if env.name not in models:
            raise CommandError(
                f"the {env.name} environment cannot {name} (it has no {needs}); "
                f"environments that can: {', '.join(models) or 'none'}",
                2,
            )
        values = {k: v for k, v in given.items() if v is not None and v != []}
        foreign = sorted(k for k in values if k not in models[env.name].model_fields)
        if foreign:
            spelled = ", ".join(f"--{k.replace('_', '-')} ({', '.join(fields[k][2])})" for k in foreign)
            raise CommandError(f"{spelled} not taken by the {env.name} environment", 2)
        try:
            options = models[env.name].model_validate(values)
        except ValidationError as exc:
            raise CommandError(describe_error(exc), 2) from None
        run(env, options)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = summary
    group.command(name)(command)
