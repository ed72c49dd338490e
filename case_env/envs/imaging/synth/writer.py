"""Write a synthetic dataset: the BIDS-like tree of docs/architecture.md, one process per patient.

Per visit: rasterise the body plan (the `ci` profile on a 2x finer grid, then majority labels and averaged
signal, so its organ volumes match the `full` profile), render Dixon images, measure volumetry, write
images, label maps, lesion map and sidecar, volumes TSV and the phantom manifest; then both reports.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from case_env import __version__
from case_env.envs.imaging.clinical import write_diagnoses
from case_env.envs.imaging.data import layout
from case_env.envs.imaging.data.nifti import save_volume
from case_env.envs.imaging.data.volumetry import OrganMeasure, label_counts, measure, write_volumes
from case_env.envs.imaging.idps import IDP_ORGANS, PDFF, VOLUME_SUFFIX, write_idps
from case_env.envs.imaging.labels import VISTA3D, LabelTable, snake
from case_env.envs.imaging.synth.anatomy import BodyPlan
from case_env.envs.imaging.synth.clinical import diagnoses_for, synthetic_eid
from case_env.envs.imaging.synth.dixon import CHANNELS, NOISE_SIGMA, dixon_images, mix_visceral_fat
from case_env.envs.imaging.synth.geometry import FOV_MM, PROFILES, STATION_NAMES, TOP_MM, station_z_ranges
from case_env.envs.imaging.synth.patient import PatientPlan, plan_patient
from case_env.envs.imaging.synth.plan import rounded
from case_env.envs.imaging.synth.raster import (
    downsample_labels,
    rasterize,
    rasterize_lesions,
    supersampled,
    true_volumes_ml,
)
from case_env.envs.imaging.synth.reports import build_report, render_markdown
from case_env.envs.imaging.tsv import write_tsv

GENERATOR = "case-env-synth"
SUPERSAMPLE = {"full": 1, "ci": 2}
_FOV_BOX = ((-FOV_MM[0] / 2, FOV_MM[0] / 2), (-FOV_MM[1] / 2, FOV_MM[1] / 2), (0.0, TOP_MM))
# Share of an organ inside a fat-water-swapped station above which its fat fraction is not reportable.
_SWAP_AFFECTED_SHARE = 0.2


class DatasetExistsError(Exception):
    """The output directory holds something we must not overwrite."""


@dataclass(frozen=True)
class PatientSummary:
    public_id: str
    subject: str
    sex: str
    age: int
    scenario: str
    seconds_per_visit: tuple[float, ...]


def _json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rounded(obj), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _rng(seed: int, index: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, index, stream])


def _stations() -> list[dict]:
    return [
        {"station": i + 1, "name": STATION_NAMES[i], "z_mm": [round(lo, 2), round(hi, 2)]}
        for i, (lo, hi) in enumerate(station_z_ranges())
    ]


def _image_sidecar(channel: str) -> dict:
    return {
        "Modality": "MR",
        "Manufacturer": "case-env synthetic phantom",
        "MagneticFieldStrength": 1.5,
        "SeriesDescription": f"Dixon_{channel} neck-to-knee (stitched)",
        "DixonChannel": channel,
        "Stations": 6,
        "StationBoundariesMm": [s["z_mm"] for s in _stations()],
        "SimulatedRepetitionTime": 0.00669,
        "SimulatedFlipAngle": 10,
        "NoiseSigma": NOISE_SIGMA,  # Rician noise level of the magnitude images (used by volumetry)
        "Synthetic": True,
    }


def _swap_affected(
    labels: np.ndarray, grid_z: np.ndarray, station: int | None, organs: dict[str, int]
) -> set[str]:
    if not station:
        return set()
    lo, hi = station_z_ranges()[station - 1]
    inside = (grid_z >= lo) & (grid_z < hi)
    out = set()
    for organ, label in organs.items():
        total = np.count_nonzero(labels == label)
        if total and np.count_nonzero(labels[:, :, inside] == label) / total > _SWAP_AFFECTED_SHARE:
            out.add(organ)
    return out


def _manifest(plan: PatientPlan, visit_index: int, profile: str, true_volumes: dict[int, float]) -> dict:
    visit = plan.visits[visit_index]
    state = visit.state
    lesions = []
    for les in state.to_json()["lesions"]:
        les["class_name"] = VISTA3D[les["vista_class"]]
        les["true_volume_ml"] = round(float(np.pi / 6 * les["diameter_mm"] ** 3 / 1000), 3)
        lesions.append(les)
    visit_state = state.to_json()
    visit_state["lesions"] = lesions
    facts = plan.scenario
    return {
        "schema": "case-env/phantom@1",
        "generator": {
            "name": GENERATOR,
            "version": __version__,
            "seed": plan.seed,
            "patient_index": plan.index,
            "profile": profile,
        },
        "patient_id": plan.public_id,
        "subject": plan.subject,
        "session": visit.session,
        "visit": visit.visit,
        "acq_date": visit.acq_date.isoformat(),
        "interval_days": visit.interval_days,
        "sex": plan.sex,
        "age": visit.age,
        "scenario": {
            "name": facts.name,
            "title": facts.title,
            "icd10": [{"code": d.code, "title": d.title} for d in facts.icd10],
            "finding": facts.finding,
            "organs": facts.organs,
        },
        "anatomy": {"body_scale": plan.anatomy.body_scale, "size": plan.anatomy.size},
        "visit_state": visit_state,
        "true_volumes_ml": {snake(VISTA3D[k]): round(v, 1) for k, v in sorted(true_volumes.items())},
        "true_fat_fraction_pct": {
            "liver": 100 * state.liver_ff,
            "pancreas": 100 * state.pancreas_ff,
            "muscle": 100 * state.muscle_ff,
        },
        "stations": _stations(),
        "artefacts": (
            [{"type": "fat_water_swap", "station": state.fat_water_swap_station}]
            if state.fat_water_swap_station
            else []
        ),
    }


def write_patient(root: Path, seed: int, index: int, profile: str) -> PatientSummary:
    plan = plan_patient(seed, index)
    grid = PROFILES[profile]
    factor = SUPERSAMPLE[profile]
    fine = supersampled(grid, factor)
    table = LabelTable.vista3d()
    sub = plan.subject
    measures: list[dict[str, OrganMeasure]] = []
    unreliable: list[set[str]] = []
    timings = []
    for vi, visit in enumerate(plan.visits):
        t0 = time.perf_counter()
        ses, state = visit.session, visit.state
        body = BodyPlan(plan.anatomy, state)
        shapes = body.shapes()
        labels_fine, tissue_fine = rasterize(shapes, fine)
        mix_visceral_fat(tissue_fine, factor, state.vat_frac, _rng(seed, index, 1))
        labels = downsample_labels(labels_fine, factor)
        del labels_fine
        lesion_map = rasterize_lesions(body.lesion_shapes(instance_labels=True), grid, factor)
        images = dixon_images(
            tissue_fine, factor, grid, state, _rng(seed, index, 2), _rng(seed, index, 10 + vi)
        )
        del tissue_fine

        for channel in CHANNELS:
            path = root / layout.channel_image(sub, ses, channel)
            save_volume(path, images[channel], grid.affine)
            _json(path.with_name(path.name.replace(".nii.gz", ".json")), _image_sidecar(channel))
        save_volume(root / layout.organ_labels(sub, ses), labels, grid.affine, is_label=True)
        save_volume(root / layout.lesion_labels(sub, ses), lesion_map, grid.affine, is_label=True)

        organ_measures = measure(labels, grid.voxel_ml, table, images["water"], images["fat"], NOISE_SIGMA)
        write_volumes(root / layout.organ_volumes(sub, ses), organ_measures)
        measures.append({m.organ: m for m in organ_measures})
        unreliable.append(
            _swap_affected(labels, grid.axis(2), state.fat_water_swap_station, {"liver": 1, "pancreas": 4})
        )
        lesion_voxels = label_counts(lesion_map)
        _json(
            root / layout.lesion_sidecar(sub, ses),
            {
                str(les.instance): {
                    "class": les.vista_class,
                    "class_name": VISTA3D[les.vista_class],
                    "organ": table.by_organ[les.organ].index if les.organ in table.by_organ else None,
                    "organ_name": les.organ,
                    "kind": les.kind,
                    "diameter_mm": les.diameter_mm,
                    "status": les.status,
                    "location": les.location,
                    "incidental": les.incidental,
                    "volume_ml": round(float(lesion_voxels[les.instance]) * grid.voxel_ml, 3),
                }
                for les in state.lesions
            },
        )
        # Ground-truth volumes for every organ but the 24 vertebral levels (landmarks, never measured).
        labels_present = sorted({lab for s in shapes for lab in s.labels if lab and not 33 <= lab <= 56})
        true_volumes = true_volumes_ml(shapes, labels_present, _FOV_BOX)
        _json(root / layout.phantom_manifest(sub, ses), _manifest(plan, vi, profile, true_volumes))
        timings.append(round(time.perf_counter() - t0, 3))

    for vi, visit in enumerate(plan.visits):
        report = build_report(plan, vi, measures, unreliable[vi])
        _json(root / layout.report(sub, visit.session, "json"), report)
        md = root / layout.report(sub, visit.session, "md")
        md.write_text(render_markdown(report, plan.public_id), encoding="utf-8")

    rows = [
        [v.session, v.acq_date.isoformat(), v.age, 2 + i, v.interval_days] for i, v in enumerate(plan.visits)
    ]
    write_tsv(
        root / layout.sessions_tsv(sub),
        ["session_id", "acq_time", "age", "ukb_instance", "interval_days"],
        rows,
    )
    return PatientSummary(
        plan.public_id, sub, plan.sex, plan.visits[0].age, plan.scenario.name, tuple(timings)
    )


def _description(seed: int, profile: str, patients: int) -> dict:
    return {
        "Name": "case-env synthetic longitudinal neck-to-knee Dixon MRI",
        "BIDSVersion": "1.10.0",
        "DatasetType": "raw",
        "GeneratedBy": [
            {
                "Name": GENERATOR,
                "Version": __version__,
                "Seed": seed,
                "Profile": profile,
                "Patients": patients,
                "Layout": LAYOUT,
            }
        ],
        "Synthetic": True,
    }


_MARKER = ".case-env-synth.json"
# The files a dataset holds; a complete dataset of an older layout (without the eid column and the clinical
# table of layout 2) is ours and is regenerated rather than refused.
LAYOUT = 2  # written first; proves the directory is ours even when incomplete


def existing_generation(out: Path) -> tuple[dict | None, bool]:
    """(the generation parameters recorded in `out`, whether that dataset is complete)."""
    try:
        wanted = json.loads((out / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, False
    try:
        desc = json.loads((out / layout.DATASET_DESCRIPTION).read_text(encoding="utf-8"))
        complete = desc["GeneratedBy"][0] == wanted
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        complete = False
    return wanted, complete


def _prepare(out: Path, wanted: dict, force: bool) -> bool:
    """Make `out` ready for writing; False when an identical complete dataset is already there."""
    if out.exists() and not out.is_dir():
        raise DatasetExistsError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        previous, complete = existing_generation(out)
        if previous is None:
            raise DatasetExistsError(
                f"{out} is not empty and was not written by `case-env synth`; refusing to touch it"
            )
        if complete and previous == wanted and not force:
            return False
        older_layout = previous.get("Layout", 1) != LAYOUT and {
            k: v for k, v in previous.items() if k != "Layout"
        } == {k: v for k, v in wanted.items() if k != "Layout"}
        if complete and previous != wanted and not force and not older_layout:
            raise DatasetExistsError(
                f"{out} already holds a synthetic dataset with other settings "
                f"(seed {previous.get('Seed')}, profile {previous.get('Profile')}, {previous.get('Patients')} patients); "
                "pass --force to replace it"
            )
        shutil.rmtree(out)  # ours: complete and forced, or an interrupted earlier run
    out.mkdir(parents=True, exist_ok=True)
    (out / _MARKER).write_text(json.dumps(wanted) + "\n", encoding="utf-8")
    return True


def _idps(out: Path, summary: PatientSummary) -> list[tuple[int, dict[str, float]]]:
    """Stand-ins for UK Biobank's own phenotypes: the phantom's continuous volumes and tissue fat fraction
    (what an independent pipeline would measure, not our voxel counts)."""
    out_rows = []
    for n, ses in enumerate(("ses-01", "ses-02")):
        truth = json.loads((out / layout.phantom_manifest(summary.subject, ses)).read_text(encoding="utf-8"))
        measures = {f"{o}{VOLUME_SUFFIX}": truth["true_volumes_ml"][o] for o in IDP_ORGANS}
        measures[PDFF] = round(truth["true_fat_fraction_pct"]["liver"], 2)
        out_rows.append((2 + n, measures))
    return out_rows


def _write_dataset_files(out: Path, seed: int, profile: str, summaries: list[PatientSummary]) -> None:
    _json(out / layout.DATASET_DESCRIPTION, _description(seed, profile, len(summaries)))
    write_tsv(
        out / layout.PARTICIPANTS,
        ["participant_id", "case_id", "eid", "sex", "age", "scenario"],
        [
            [s.subject, s.public_id, synthetic_eid(i), s.sex, s.age, s.scenario]
            for i, s in enumerate(summaries)
        ],
    )
    write_diagnoses(
        out,
        [
            (s.subject, synthetic_eid(i), record)
            for i, s in enumerate(summaries)
            for record in diagnoses_for(plan_patient(seed, i))
        ],
    )
    write_idps(
        out, [(s.subject, synthetic_eid(i), *m) for i, s in enumerate(summaries) for m in _idps(out, s)]
    )
    _json(
        out / "participants.json",
        {
            "case_id": {"Description": "Public patient id used by the tools (CASE convention)"},
            "eid": {"Description": "UK Biobank-style participant id (synthetic: 9000001 onwards)"},
            "sex": {"Description": "Sex", "Levels": {"F": "female", "M": "male"}},
            "age": {"Description": "Age at the first imaging visit", "Units": "years"},
            "scenario": {"Description": "Synthetic ground truth: what changes between visits (never served)"},
        },
    )
    (out / ".bidsignore").write_text("*_phantom.json\n", encoding="utf-8")
    seg = out / layout.SEGMENTATIONS
    _json(
        seg / "dataset_description.json",
        {
            "Name": "Organ and lesion label maps",
            "BIDSVersion": "1.10.0",
            "DatasetType": "derivative",
            "GeneratedBy": [
                {"Name": GENERATOR, "Version": __version__, "Description": "phantom ground truth"}
            ],
        },
    )
    LabelTable.vista3d().write_tsv(out / layout.LABEL_TABLE)
    _json(
        out / layout.REPORTS / "dataset_description.json",
        {
            "Name": "Radiology reports",
            "BIDSVersion": "1.10.0",
            "DatasetType": "derivative",
            "GeneratedBy": [{"Name": GENERATOR, "Version": __version__}],
        },
    )


def generate_dataset(
    out: Path,
    patients: int,
    profile: str,
    seed: int,
    force: bool = False,
    jobs: int = 1,
    progress: Callable[[PatientSummary], None] | None = None,
) -> tuple[list[PatientSummary], bool]:
    """Write the dataset; returns (summaries, written). An identical existing dataset is kept as is."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    if patients < 1:
        raise ValueError("--patients must be at least 1")
    wanted = _description(seed, profile, patients)["GeneratedBy"][0]
    if not _prepare(out, wanted, force):
        return [], False
    summaries: list[PatientSummary] = []
    if jobs > 1 and patients > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, patients)) as pool:
            futures = [pool.submit(write_patient, out, seed, i, profile) for i in range(patients)]
            for future in futures:
                summaries.append(future.result())
                if progress:
                    progress(summaries[-1])
    else:
        for i in range(patients):
            summaries.append(write_patient(out, seed, i, profile))
            if progress:
                progress(summaries[-1])
    _write_dataset_files(out, seed, profile, summaries)  # last: its presence marks a complete dataset
    return summaries, True
