"""What a stateful tool call carries besides its arguments: the episode's earlier patient exchanges and noise
(clinic), its earlier submitted diagnoses and attempt budget (case reasoning).

The server holds no conversation state (any worker answers any call, a retried call is idempotent), so the
caller sends what the patient simulator or the attempt counter needs: the questions asked so far with the
answers given, the noise configuration of the bank row, the diagnoses already submitted. Both come from the trajectory and the dataset row, never from the
model: the verl adapter fills them in, and no tool schema has a field for them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from case_env.clinic.noise import NoiseConfig

MAX_EXCHANGES = 64
MAX_TEXT = 4000


class Exchange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    question: str = Field(max_length=MAX_TEXT, description="What the clinician asked.")
    answer: str = Field(max_length=MAX_TEXT, description="What the patient answered.")


class EpisodeContext(BaseModel):
    model_config = ConfigDict(extra="forbid")

    history: list[Exchange] = Field(
        default_factory=list, max_length=MAX_EXCHANGES,
        description="Earlier ask_patient exchanges of this episode, oldest first.",
    )  # fmt: skip
    noise: NoiseConfig = Field(
        default_factory=NoiseConfig, description="The bank row's noise configuration (no noise by default)."
    )
    submissions: list[str] = Field(
        default_factory=list, max_length=MAX_EXCHANGES,
        description="Diagnoses this episode already submitted with submit_diagnosis, oldest first.",
    )  # fmt: skip
    attempts: int = Field(1, ge=1, le=MAX_EXCHANGES, description="The row's attempt budget k.")
