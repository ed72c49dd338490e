"""What an imaging tool may touch: this call's patient, through the data store and the renderer."""

from __future__ import annotations

from dataclasses import dataclass

from case_env.core.errors import UnknownVisitError
from case_env.core.tools import ErrorCode, ToolContext, ToolError
from case_env.envs.imaging.data.index import VisitFiles
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.data.volumetry import OrganMeasure
from case_env.envs.imaging.labels import organ_name
from case_env.envs.imaging.terms import COMMON_ORGANS
from case_env.envs.imaging.viewer.service import Imaging


@dataclass
class ImagingContext(ToolContext):
    @property
    def patients(self) -> PatientStore:
        return self.store.patients

    @property
    def imaging(self) -> Imaging:
        return self.store.imaging

    def visit(self, visit: str) -> VisitFiles:
        try:
            return self.patients.visit(self.patient_id, str(visit))
        except UnknownVisitError as exc:
            raise ToolError(
                ErrorCode.UNKNOWN_VISIT,
                f"visit {visit!r} does not exist for this patient; valid visits: {', '.join(exc.valid)}",
            ) from None

    def organ(self, organ: str, visit: str) -> OrganMeasure:
        """The named organ's measures at a visit; accepts spellings such as 'Left kidney' or 'kidney_left'."""
        self.visit(visit)
        volumetry = self.patients.volumetry(self.patient_id, str(visit))
        name = organ_name(organ)
        if name not in volumetry:
            present = [o for o in COMMON_ORGANS if o in volumetry]
            others = len(volumetry) - len(present)
            more = f" (and {others} more, e.g. lung lobes and vertebrae)" if others > 0 else ""
            raise ToolError(
                ErrorCode.UNKNOWN_ORGAN,
                f"organ {organ!r} is not segmented for this patient at {visit}; available: "
                f"{', '.join(present)}{more}",
            )
        return volumetry[name]
