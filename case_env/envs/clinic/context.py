"""What a clinic call carries besides its arguments (the row's noise configuration and persona choice,
`ClinicSetup`), and what a clinic tool sees of its episode (`ClinicEpisode`): those settings with the
earlier patient exchanges, which the server builds from its own log of the episode
(`ClinicEnvironment.episode_context`). Neither comes from the model: no tool schema has a field for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from case_env.core.text_cases import CaseContext
from case_env.envs.clinic.noise import NoiseConfig, noisy_findings
from case_env.medicine.exams import ExamCall, RecordedExam

MAX_EXCHANGES = 64
MAX_TEXT = 4000


class Exchange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    question: str = Field(max_length=MAX_TEXT, description="What the clinician asked.")
    answer: str = Field(max_length=MAX_TEXT, description="What the patient answered.")
    ordered: list[str] = Field(
        default_factory=list,
        max_length=MAX_EXCHANGES,
        description="Exams the clinician ordered before this question, as the patient hears of them.",
    )


class ClinicSetup(BaseModel):
    """The row's settings for its episodes, sent with each call (the server keeps the first call's)."""

    model_config = ConfigDict(extra="forbid")

    noise: NoiseConfig = Field(
        default_factory=NoiseConfig, description="The bank row's noise configuration (no noise by default)."
    )
    persona: bool = Field(
        True,
        description="The patient plays the case's persona; MedExAgent's evaluation runs without one.",
    )


class ClinicEpisode(ClinicSetup):
    """What a clinic tool sees: the row's settings and the episode so far, as the server's log holds it."""

    history: list[Exchange] = Field(
        default_factory=list,
        max_length=MAX_EXCHANGES,
        description="Earlier ask_patient exchanges of this episode, oldest first.",
    )
    ordered: list[str] = Field(
        default_factory=list,
        max_length=MAX_EXCHANGES,
        description="Exams ordered since the last exchange, as the patient hears of them.",
    )


@dataclass
class ClinicContext(CaseContext):
    episode: ClinicEpisode

    def result(self, call: ExamCall) -> tuple[RecordedExam, str] | None:
        """The recorded exam `call` matches and its findings under the episode's noise; None if none does."""
        case = self.case()
        found = case.findings(call)
        if not found:
            return None
        slot, findings = found[0]
        noise = self.episode.noise
        kind = self.cases.plan(case, noise).exams.get(slot)
        if kind is not None:
            findings = noisy_findings(findings, kind, case.case_id, slot, noise.seed, noise.mode)
        return case.exams[slot], findings
