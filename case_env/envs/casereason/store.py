"""The server's case-reasoning cases, loaded once per worker: `CASE_ENV_CASEREASON_CASES` (files or
directories, separated by the path separator), else `<data root>/casereason/` when it exists."""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from case_env.core.text_cases import CaseTable, case_paths
from case_env.envs.casereason.cases import load_cases

log = logging.getLogger("case_env.casereason")


class CaseReasonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CASE_ENV_CASEREASON_", extra="ignore")

    cases: str | None = Field(None, description="Case files or directories, separated by the path separator.")


class ReasoningCases(CaseTable):
    @classmethod
    def load(cls, settings: CaseReasonSettings, data_root: Path | None = None) -> ReasoningCases:
        paths = case_paths(settings.cases, data_root, "casereason")
        loaded = load_cases(paths)
        if paths:
            log.info("case reasoning: %d cases, %d problem(s)", len(loaded.cases), len(loaded.problems))
        return cls(loaded.cases, loaded.problems)
