"""Settings of the data layer, from arguments or `CASE_ENV_*` environment variables."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "case-env"


class DataSettings(BaseSettings):
    """Where case data lives, how much of it stays decoded in memory, and how large rendered images are."""

    model_config = SettingsConfigDict(env_prefix="CASE_ENV_", extra="ignore")

    data_root: Path = Field(Path("data/synthetic"), description="Root of the BIDS-like patient data tree.")
    cache_bytes: int = Field(
        2 * 1024**3,
        ge=0,
        description="Upper bound on decoded volumes kept in memory (bytes). A ci-profile patient (two visits, "
        "four channels and labels) takes about 33 MB, a full-profile one about 260 MB.",
    )
    decoded_bytes: int = Field(
        16 * 1024**3,
        ge=0,
        description="Disk budget for decoded volumes under cache_dir/decoded, memory-mapped and shared by all "
        "workers (0: every worker decodes into its own memory).",
    )
    stat_ttl_s: float = Field(
        1.0,
        ge=0,
        description="Seconds a file's stat (mtime, size) is trusted before a replaced file is noticed.",
    )
    image_max_side: int = Field(448, ge=64, le=2048, description="Longest side of returned images in pixels.")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Directory for derived data (volumetry of roots without a volumes TSV); never inside "
        "the data root.",
    )
