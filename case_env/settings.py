"""Settings every layer shares, from arguments or `CASE_ENV_*` environment variables: where case data lives
(an environment's own data settings subclass these, in its package) and what scoring one row may take."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "case-env"


class DataSettings(BaseSettings):
    """The data root and the cache directory."""

    model_config = SettingsConfigDict(env_prefix="CASE_ENV_", extra="ignore")

    data_root: Path = Field(
        Path("data/synthetic"),
        description="Root of the case data (each environment reads its own part; text environments also "
        "take their case files from CASE_ENV_<ENV>_CASES).",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Directory for derived data (volumetry of roots without a volumes TSV); never inside "
        "the data root.",
    )


class ScoreSettings(BaseSettings):
    """The deadline of scoring one row, the same wherever a reward is computed (verl, /v1/score, eval)."""

    model_config = SettingsConfigDict(env_prefix="CASE_ENV_", extra="ignore")

    score_deadline_s: float = Field(
        30.0,
        gt=0,
        description="Deadline of scoring one row (a judge's round trips included); past it the row scores 0, "
        "format_ok false, with the reason.",
    )
