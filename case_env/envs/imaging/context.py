"""What an imaging tool may touch: this call's patient, through the data store and the renderer."""

from __future__ import annotations

from dataclasses import dataclass, field

from case_env.core.control import excerpt
from case_env.core.tools import ToolContext, ToolError
from case_env.envs.imaging.data.errors import UnknownVisitError
from case_env.envs.imaging.data.index import VisitFiles
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.data.volumetry import OrganMeasure
from case_env.envs.imaging.labels import organ_name
from case_env.envs.imaging.terms import COMMON_ORGANS, ImagingFault
from case_env.envs.imaging.viewer.render import Plane
from case_env.envs.imaging.viewer.service import Imaging, OrganNotFoundError, SlicePosition


@dataclass
class ImagingContext(ToolContext):
    """One call's view of its patient. A visit and an organ named by the call are resolved once and kept for
    the rest of the call (a render used to look its visit up some eight times), and every refusal about them
    is phrased here."""

    # made on first use: most calls (list_visits, answered from memory on the event loop) need neither
    _visits: dict[str, VisitFiles] | None = field(default=None, init=False, repr=False)
    _organs: dict[tuple[str, str], OrganMeasure] | None = field(default=None, init=False, repr=False)

    @property
    def patients(self) -> PatientStore:
        return self.cases.patients

    @property
    def imaging(self) -> Imaging:
        return self.cases.imaging

    def visit(self, visit: str) -> VisitFiles:
        if self._visits is None:
            self._visits = {}
        found = self._visits.get(visit)
        if found is None:
            try:
                found = self._visits[visit] = self.patients.visit(self.case_id, str(visit))
            except UnknownVisitError as exc:
                raise ToolError(
                    ImagingFault.UNKNOWN_VISIT,
                    f"visit {excerpt(visit)} does not exist for this patient; valid visits: {', '.join(exc.valid)}",
                ) from None
        return found

    def organ(self, organ: str, visit: str) -> OrganMeasure:
        """The named organ's measures at a visit; accepts spellings such as 'Left kidney' or 'kidney_left'."""
        if self._organs is None:
            self._organs = {}
        found = self._organs.get((organ, visit))
        if found is not None:
            return found
        self.visit(visit)
        volumetry = self.patients.volumetry(self.case_id, str(visit))
        name = organ_name(organ)
        if name not in volumetry:
            present = [o for o in COMMON_ORGANS if o in volumetry]
            others = len(volumetry) - len(present)
            more = f" (and {others} more, e.g. lung lobes and vertebrae)" if others > 0 else ""
            raise ToolError(
                ImagingFault.UNKNOWN_ORGAN,
                f"organ {excerpt(organ)} is not segmented for this patient at {visit}; available: "
                f"{', '.join(present)}{more}",
            )
        found = self._organs[(organ, visit)] = volumetry[name]
        return found

    def positions(
        self, visits: list[str], plane: Plane, organ: str | None, percent: float | None, sequence: str
    ) -> dict[str, SlicePosition]:
        """Where to cut each visit: `percent` (default 50) along the organ's extent, checked at every visit,
        or along the whole scan. Each position carries its visit's volume, so the render fetches none again."""
        name = None
        if organ is not None:
            name = self.organ(organ, visits[0]).organ
            for v in visits[1:]:
                self.organ(organ, v)
        percent = 50.0 if percent is None else percent
        try:
            return self.imaging.positions(self.case_id, visits, plane, percent, name, sequence)
        except OrganNotFoundError:  # measured (a volumes table) but absent from the label map
            raise ToolError(
                ImagingFault.UNKNOWN_ORGAN, f"organ {excerpt(organ)} has no voxels in the segmentation"
            ) from None
