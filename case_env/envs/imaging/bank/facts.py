"""What the bank builder knows about a patient: measured values (as the tools will report them) and the
synthetic ground truth (scenario, lesions, artefacts) that decides answers.

Measured values come from the same store the server uses, rounded as the tools print them, so an answer
is always readable from tool output. Ground truth comes from the phantom manifests; patients without one
(real data) cannot be turned into questions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.viewer.render import Plane
from case_env.envs.imaging.viewer.service import Imaging

VISITS = ("baseline", "follow_up")


@dataclass
class VisitFacts:
    visit: str
    date: str
    volumes: dict[str, float]  # mL, 1 decimal, as get_organ_volume prints
    fat: dict[str, float | None]  # signal fat fraction %, 1 decimal
    manifest: dict
    report: dict | None


@dataclass
class PatientFacts:
    patient_id: str
    scenario: str
    icd10: list[dict]
    visits: dict[str, VisitFacts]
    interval_days: int
    swap_station: int | None = None
    liver_swap_share: float = 0.0  # share of the follow-up liver inside the fat-water-swapped station

    @property
    def liver_swapped(self) -> bool:
        """Most of the liver is in the swapped station: its fat images are artefactual as a whole."""
        return self.liver_swap_share >= 0.5

    @property
    def liver_partly_swapped(self) -> bool:
        """Part of the liver is swapped: what its fat images show depends on the level, so liver image
        questions would be ambiguous and are not asked."""
        return 0.0 < self.liver_swap_share < 0.5

    lesions: dict[str, list[dict]] = field(default_factory=dict)  # per visit, manifest lesion entries

    def change_pct(self, organ: str) -> float:
        """Relative change as compare_organ_volume prints it (1 decimal)."""
        before, after = self.visits["baseline"].volumes[organ], self.visits["follow_up"].volumes[organ]
        return round(100.0 * (after - before) / before, 1)

    def lesion_tracks(self) -> list[dict]:
        """Every lesion instance of either visit, with its diameters at both (None where absent)."""
        tracks: dict[int, dict] = {}
        for i, visit in enumerate(VISITS):
            for les in self.lesions.get(visit, []):
                track = tracks.setdefault(les["instance"], {**les, "diameters": [None, None]})
                track["diameters"][i] = les["diameter_mm"]
                track.update({k: les[k] for k in ("status", "centre_mm", "location", "organ", "kind")})
        return [tracks[k] for k in sorted(tracks)]


def gather(store: PatientStore) -> tuple[list[PatientFacts], list[str]]:
    """Facts of every patient with ground truth at both visits; and why the others were skipped."""
    facts, skipped = [], []
    for pid in store.patient_ids():
        visits = {v.visit: v for v in store.patient(pid).visits}
        if not all(v in visits for v in VISITS):
            skipped.append(f"{pid}: needs a baseline and a follow-up visit")
            continue
        manifests = {v: store.manifest(pid, v) for v in VISITS}
        if any(m is None for m in manifests.values()):
            skipped.append(f"{pid}: no phantom manifest (real data has no ground truth for questions)")
            continue
        per_visit = {}
        for v in VISITS:
            volumetry = store.volumetry(pid, v)
            report = store.report(pid, v)
            per_visit[v] = VisitFacts(
                visit=v,
                date=visits[v].acq_date.isoformat() if visits[v].acq_date else "",
                volumes={o: round(m.volume_ml, 1) for o, m in volumetry.items()},
                fat={
                    o: None if m.fat_fraction_pct is None else round(m.fat_fraction_pct, 1)
                    for o, m in volumetry.items()
                },
                manifest=manifests[v],
                report=report.structured if report else None,
            )
        follow = manifests["follow_up"]
        swap = next(
            (a["station"] for a in follow.get("artefacts", []) if a["type"] == "fat_water_swap"), None
        )
        facts.append(
            PatientFacts(
                patient_id=pid,
                scenario=follow["scenario"]["name"],
                icd10=follow["scenario"]["icd10"],
                visits=per_visit,
                interval_days=visits["follow_up"].interval_days or 0,
                swap_station=swap,
                liver_swap_share=_share_in_station(store, pid, swap) if swap else 0.0,
                lesions={v: manifests[v]["visit_state"]["lesions"] for v in VISITS},
            )
        )
    return facts, skipped


def _share_in_station(store: PatientStore, pid: str, station: int) -> float:
    """Share of the follow-up liver's voxels inside a station's z range."""
    labels = store.organ_labels(pid, "follow_up")
    low, high = store.stations(pid, "follow_up")[station - 1]
    z = labels.affine[2, 3] + np.arange(labels.shape[2]) * labels.affine[2, 2]
    liver = labels.data == store.label_table.by_organ["liver"].index
    total = int(liver.sum())
    return float(liver[:, :, (z >= low) & (z < high)].sum()) / total if total else 0.0


def lesion_position(imaging: Imaging, fact: PatientFacts, organ: str, centre_mm: list[float]) -> float:
    """The render `position` (percent of the organ's axial extent over both visits) through a lesion."""
    percent = imaging.percent_at(fact.patient_id, list(VISITS), Plane.AXIAL, centre_mm[2], organ, "water")
    return round(percent, 1)
