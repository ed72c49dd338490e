"""Where case data lives, from arguments or `CASE_ENV_*` environment variables: what every environment shares.
An environment's own data settings subclass these (how much decoded data it keeps, say), in its package."""

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
