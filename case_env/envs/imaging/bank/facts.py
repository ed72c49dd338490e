"""What the bank builder knows about a patient: measured values (as the tools will report them), the
clinical record (diagnoses with dates) when there is one, and the synthetic ground truth (scenario,
lesions, artefacts) when there is a phantom manifest.

Measured values come from the same store the server uses, rounded as the tools print them, so an answer
is always readable from tool output. Lesions are measured from the lesion instance map: presence per
visit, host organ (the organ label under most of its voxels) and the volume-equivalent diameter
(6V/pi)^(1/3). That diameter is robust at 4.5-mm voxels, where a longest-axis caliper moves in voxel
steps; on the synthetic spheres it is within 1.5 mm of the true diameter. Real data has no manifest, so
every template whose truth is measurable uses the measurement (`truth="measured"`, the default); the
manifest is for the templates only a generator can know and for checking the measured truth against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from case_env.envs.imaging.clinical import DiagnosisRecord
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.viewer.render import Plane
from case_env.envs.imaging.viewer.service import Imaging

VISITS = ("baseline", "follow_up")
Truth = Literal["measured", "manifest"]


@dataclass
class VisitFacts:
    visit: str
    date: str
    volumes: dict[str, float]  # mL, 1 decimal, as get_organ_volume prints
    fat: dict[str, float | None]  # signal fat fraction %, 1 decimal
    manifest: dict | None
    report: dict | None


@dataclass
class PatientFacts:
    patient_id: str
    scenario: str  # "" without a manifest
    icd10: list[dict]  # the scenario's diagnosis; [] without a manifest
    visits: dict[str, VisitFacts]
    interval_days: int
    truth: Truth = "measured"
    diagnoses: list[DiagnosisRecord] | None = None  # the clinical table's rows; None when it has none
    measured_lesions: list[dict] = field(default_factory=list)  # tracks measured from the lesion maps
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

    @property
    def has_manifest(self) -> bool:
        return all(self.visits[v].manifest is not None for v in VISITS)

    @property
    def baseline_date(self) -> str:
        return self.visits["baseline"].date

    @property
    def follow_up_date(self) -> str:
        return self.visits["follow_up"].date

    def change_pct(self, organ: str) -> float:
        """Relative change as compare_organ_volume prints it (1 decimal)."""
        before, after = self.visits["baseline"].volumes[organ], self.visits["follow_up"].volumes[organ]
        return round(100.0 * (after - before) / before, 1)

    def lesion_tracks(self) -> list[dict]:
        """Every lesion instance of either visit with its diameters at both (None where absent): measured
        from the lesion maps, or from the manifests when the bank is built from manifest truth."""
        if self.truth == "measured":
            return self.measured_lesions
        tracks: dict[int, dict] = {}
        for i, visit in enumerate(VISITS):
            for les in self.lesions.get(visit, []):
                track = tracks.setdefault(les["instance"], {**les, "diameters": [None, None]})
                track["diameters"][i] = les["diameter_mm"]
                track.update({k: les[k] for k in ("status", "centre_mm", "location", "organ", "kind")})
        return [tracks[k] for k in sorted(tracks)]


def gather(
    store: PatientStore,
    truth: Truth = "measured",
    diagnoses: dict[str, list[DiagnosisRecord]] | None = None,
) -> tuple[list[PatientFacts], list[str]]:
    """Facts of every patient with both visits; and why the others were skipped. With manifest truth a
    patient also needs both phantom manifests."""
    facts, skipped = [], []
    for pid in store.patient_ids():
        visits = {v.visit: v for v in store.patient(pid).visits}
        if not all(v in visits for v in VISITS):
            skipped.append(f"{pid}: needs a baseline and a follow-up visit")
            continue
        manifests = {v: store.manifest(pid, v) for v in VISITS}
        if truth == "manifest" and any(m is None for m in manifests.values()):
            skipped.append(
                f"{pid}: no phantom manifest (manifest truth needs one; real data uses measured truth)"
            )
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
        fact = PatientFacts(
            patient_id=pid,
            scenario="",
            icd10=[],
            visits=per_visit,
            interval_days=visits["follow_up"].interval_days or 0,
            truth=truth,
            diagnoses=None if diagnoses is None else diagnoses.get(pid, []),
            measured_lesions=measure_lesions(store, pid),
        )
        follow = manifests["follow_up"]
        if follow is not None and manifests["baseline"] is not None:
            swap = next(
                (a["station"] for a in follow.get("artefacts", []) if a["type"] == "fat_water_swap"), None
            )
            fact.scenario = follow["scenario"]["name"]
            fact.icd10 = follow["scenario"]["icd10"]
            fact.swap_station = swap
            fact.liver_swap_share = _share_in_station(store, pid, swap) if swap else 0.0
            fact.lesions = {v: manifests[v]["visit_state"]["lesions"] for v in VISITS}
        facts.append(fact)
    return facts, skipped


def measure_lesions(store: PatientStore, pid: str) -> list[dict]:
    """Lesion tracks from the lesion instance maps (ids are kept across visits): per instance the
    volume-equivalent diameter at each visit (None where absent), the centroid at the latest visit that
    has it, the host organ, and the sidecar's descriptive fields (location, kind) when there is one."""
    tracks: dict[int, dict] = {}
    for i, visit in enumerate(VISITS):
        lesions = store.lesion_labels(pid, visit)
        if lesions is None:
            continue
        organs = store.organ_labels(pid, visit).data
        sidecar = store.lesions(pid, visit)
        table = store.label_table
        voxel_ml = lesions.voxel_ml
        for instance in (int(x) for x in np.unique(lesions.data) if x):
            where = np.nonzero(lesions.data == instance)
            count = len(where[0])
            diameter = (6.0 * count * voxel_ml * 1000.0 / np.pi) ** (1.0 / 3.0)
            hosts = np.bincount(organs[where].astype(np.int64))
            hosts[0] = 0
            host = table.organ(int(hosts.argmax())) if hosts.any() else ""
            centre = lesions.affine @ np.array([*(float(np.mean(a)) for a in where), 1.0])
            facts = sidecar.get(instance, {})
            organ, location = host, str(facts.get("location") or "")
            if host.startswith("vertebrae_"):
                organ = "vertebrae"
                location = location or f"{host.split('_', 1)[1].upper()} vertebral body"
            track = tracks.setdefault(
                instance,
                {"instance": instance, "diameters": [None, None], "incidental": False, "kind": ""},
            )
            track["diameters"][i] = round(float(diameter), 1)
            track.update(
                centre_mm=[round(float(c), 1) for c in centre[:3]],
                organ=organ,
                location=location,
                kind=str(facts.get("kind") or track["kind"]),
            )
    return [tracks[k] for k in sorted(tracks)]


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
