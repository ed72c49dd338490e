"""The server's clinic cases and patient simulator, loaded once per worker.

Cases come from `CASE_ENV_CLINIC_CASES` (CSV or JSONL files, or directories of them, separated by the
path separator), else from `<data root>/clinic/` when that directory exists; without either the clinic
tools answer that no clinic case exists. The LLM patient is used when `CASE_ENV_CLINIC_PATIENT_URL` is set.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from case_env.core.cache import Memo
from case_env.core.llm import DEFAULT_CONCURRENCY, ChatClient, LLMSettings
from case_env.core.text_cases import CaseTable, case_paths
from case_env.envs.clinic.cases import ClinicCase, load_cases
from case_env.envs.clinic.noise import NoiseConfig, NoisePlan, plan_noise
from case_env.envs.clinic.patient import LLMPatient, RulePatient

log = logging.getLogger("case_env.envs.clinic")
PLANS_KEPT = 65536  # noise plans kept: a bank's cases under one configuration, a few hundred bytes each


class ClinicSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CASE_ENV_CLINIC_", extra="ignore")

    cases: str | None = Field(None, description="Case files or directories, separated by the path separator.")
    patient_url: str | None = Field(None, description="OpenAI-compatible endpoint of an LLM patient.")
    patient_model: str = Field(
        "gpt-4.1-mini",
        description="Model of the LLM patient (MedExAgent trained against Qwen/Qwen3-30B-A3B, evaluated with gpt-4.1-mini).",
    )
    patient_temperature: float = Field(0.7, ge=0, le=2, description="MedExAgent's patient temperature, 0.7.")
    # MedExAgent's patient (train/rl/interaction.py, config/interaction_config_rl.yaml): 60 s per request,
    # 2,048 tokens (room for Qwen3's thinking before the reply), a fresh sample for every reply
    patient_timeout_s: float = Field(60.0, gt=0, description="Past this, the rule-based patient answers.")
    patient_max_tokens: int = Field(2048, ge=1, description="Longest reply of the LLM patient.")
    patient_concurrency: int = Field(
        DEFAULT_CONCURRENCY,
        ge=1,
        description="Requests in flight to the patient endpoint from one server worker; the rest wait in its queue.",
    )
    patient_retries: int = Field(
        2, ge=0, description="Attempts after a failed one (connection error, 429, 5xx)."
    )
    patient_cache: Path | None = Field(None, description="SQLite cache of LLM patient answers.")
    patient_cache_replies: bool = Field(
        False,
        description="Answer a repeated conversation with the cached reply, so every rollout of a group hears "
        "the same patient; MedExAgent samples every reply afresh (the default).",
    )


class ClinicCases(CaseTable):
    def __init__(
        self,
        cases: list[ClinicCase],
        problems: list[str] | None = None,
        llm: ChatClient | None = None,
        fresh: bool = False,
    ):
        super().__init__(cases, problems)
        self.llm = llm
        self.fresh = fresh
        self._plans = Memo(PLANS_KEPT)

    def plan(self, case: ClinicCase, noise: NoiseConfig) -> NoisePlan:
        """The case's noise plan under a row's configuration, made once and kept (the most recent
        `PLANS_KEPT`): every call of every rollout of the case reads the same plan."""
        key = (case.case_id, noise.model_dump_json())
        plan = self._plans.get(key)
        if plan is None:  # deterministic: two threads that miss together make the same plan
            plan = plan_noise(case, noise)
            self._plans.put(key, plan)
        return plan

    @classmethod
    def load(cls, settings: ClinicSettings, data_root: Path | None = None) -> ClinicCases:
        paths = case_paths(settings.cases, data_root, "clinic")
        loaded = load_cases(paths)
        llm = None
        if settings.patient_url:
            llm = ChatClient(
                LLMSettings(
                    base_url=settings.patient_url,
                    model=settings.patient_model,
                    timeout_s=settings.patient_timeout_s,
                    max_tokens=settings.patient_max_tokens,
                    temperature=settings.patient_temperature,
                    cache_path=settings.patient_cache,
                    concurrency=settings.patient_concurrency,
                    retries=settings.patient_retries,
                )
            )
        fresh = not settings.patient_cache_replies
        if paths:
            log.info("clinic: %d cases, %d problem(s)", len(loaded.cases), len(loaded.problems))
        return cls(loaded.cases, loaded.problems, llm, fresh if llm is not None else False)

    def patient(self, case: ClinicCase, plan: NoisePlan, persona: bool = True) -> RulePatient | LLMPatient:
        if self.llm is None:
            return RulePatient(case, plan, persona)
        return LLMPatient(self.llm, case, plan, self.fresh, persona)
