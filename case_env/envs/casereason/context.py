"""What a case-reasoning call carries besides its arguments: the diagnoses this episode already submitted
and the row's attempt budget k, sent by the caller (the server keeps no state; the verl adapter and the
eval runner build it with `CaseReasonEnvironment.episode_context`)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from case_env.core.text_cases import CaseContext

MAX_ATTEMPTS = 64


class ReasoningEpisode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    submissions: list[str] = Field(
        default_factory=list,
        max_length=MAX_ATTEMPTS,
        description="Diagnoses this episode already submitted with submit_diagnosis, oldest first.",
    )
    attempts: int = Field(1, ge=1, le=MAX_ATTEMPTS, description="The row's attempt budget k.")


@dataclass
class ReasoningContext(CaseContext):
    episode: ReasoningEpisode
