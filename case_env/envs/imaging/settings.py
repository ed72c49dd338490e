"""The imaging data layer's settings: the shared data settings, and how much of the data stays decoded and how
large rendered images are (`CASE_ENV_*` variables, or arguments)."""

from __future__ import annotations

from pydantic import Field

from case_env.settings import DataSettings


class ImagingSettings(DataSettings):
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

    @classmethod
    def of(cls, data: DataSettings) -> ImagingSettings:
        """These settings for the shared ones a server was given (the rest from the environment)."""
        if isinstance(data, cls):
            return data
        return cls(data_root=data.data_root, cache_dir=data.cache_dir)
