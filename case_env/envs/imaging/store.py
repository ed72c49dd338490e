"""The imaging environment's cases as a server worker holds them: the patient data store and its renderer."""

from __future__ import annotations

from dataclasses import dataclass

from case_env.core.problems import Problems
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.viewer.service import Imaging


@dataclass
class ImagingCases:
    patients: PatientStore
    imaging: Imaging

    @property
    def problems(self) -> Problems:
        return Problems(self.patients.index.errors)

    def ids(self) -> list[str]:
        return self.patients.patient_ids()

    def __contains__(self, case_id: object) -> bool:
        return case_id in self.patients.index.patients

    def fingerprint(self, case_id: str) -> tuple:
        return self.patients.fingerprint(case_id)

    def warm(self, case_id: str) -> None:
        """Decode the patient's volumes and bring its windows and organ extents into memory: an episode
        starts with cheap calls (visits, context), so its first render finds them ready."""
        self.patients.preload(case_id, 1)
        self.imaging.warm(case_id)

    def memory_bytes(self) -> int:
        return self.patients.cache.stats().bytes
