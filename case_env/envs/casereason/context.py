"""What a case-reasoning call carries besides its arguments (the row's attempt budget k, `ReasoningSetup`),
and what its tool sees (`ReasoningEpisode`): that budget with the diagnoses the episode already had judged,
counted by the server from its own log (`CaseReasonEnvironment.episode_context`): a client cannot spend an
attempt twice by leaving it out."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from case_env.core.text_cases import CaseContext

MAX_ATTEMPTS = 64


class ReasoningSetup(BaseModel):
    """The row's settings for its episodes, sent with each call (the server keeps the first call's)."""

    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(1, ge=1, le=MAX_ATTEMPTS, description="The row's attempt budget k.")


class ReasoningEpisode(ReasoningSetup):
    submissions: list[str] = Field(
        default_factory=list,
        max_length=MAX_ATTEMPTS,
        description="Diagnoses this episode already submitted with submit_diagnosis, oldest first.",
    )


@dataclass
class ReasoningContext(CaseContext):
    episode: ReasoningEpisode
