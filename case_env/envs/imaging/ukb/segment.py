"""`case-env segment`: organ label maps for visits that have none, in the layout's convention.

The engine is TotalSegmentator's `total_mr` task (the `segment` extra; its weights are the user's own
download, fetched by TotalSegmentator on first use or found under TOTALSEG_HOME_DIR). It runs on the
in-phase image, the channel closest to the T1-weighted images the task was trained on (our choice). Its
multi-label output is converted from total_mr class numbers to VISTA3D ids through the class names
(`labels._TOTAL_MR`): the numbering comes from the installed TotalSegmentator's own class map, because it
has changed between releases, else from the 2.18.0 table below (imaging.md §2.2, from the wheel's
`map_to_binary.py`). Classes VISTA3D has no single id for are left out and counted: the vertebrae (one
total_mr class, 24 VISTA3D levels) and the intervertebral discs; both lungs become VISTA3D `lung` (20).
Volumetry of the new map is written beside it.

`--copy-derivatives-from ROOT` takes label maps, lesion maps and reports from another data root instead
(matched by eid and session, the grids checked), which is how the real-data walk-through stands the
synthetic generator's maps in for a segmentation engine.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import nibabel as nib
import numpy as np

from case_env.envs.imaging.data import layout
from case_env.envs.imaging.data.nifti import save_volume
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.data.volumetry import measure, write_volumes
from case_env.envs.imaging.labels import _TOTAL_MR, LabelTable
from case_env.envs.imaging.tsv import TsvError, read_tsv

INSTALL = (
    "organ segmentation needs TotalSegmentator: pip install 'case-env[segment]' (brings torch and "
    "nnunetv2); its total_mr weights download on first use, or put them under TOTALSEG_HOME_DIR"
)
SEGMENTED_CHANNEL = "in"

# fmt: off
TOTAL_MR_2_18 = {
    1: "spleen", 2: "kidney_right", 3: "kidney_left", 4: "gallbladder", 5: "liver", 6: "stomach",
    7: "pancreas", 8: "adrenal_gland_right", 9: "adrenal_gland_left", 10: "lung_left", 11: "lung_right",
    12: "esophagus", 13: "small_bowel", 14: "duodenum", 15: "colon", 16: "urinary_bladder", 17: "prostate",
    18: "sacrum", 19: "vertebrae", 20: "intervertebral_discs", 21: "spinal_cord", 22: "heart", 23: "aorta",
    24: "inferior_vena_cava", 25: "portal_vein_and_splenic_vein", 26: "iliac_artery_left",
    27: "iliac_artery_right", 28: "iliac_vena_left", 29: "iliac_vena_right", 30: "humerus_left",
    31: "humerus_right", 32: "scapula_left", 33: "scapula_right", 34: "clavicula_left",
    35: "clavicula_right", 36: "femur_left", 37: "femur_right", 38: "hip_left", 39: "hip_right",
    40: "gluteus_maximus_left", 41: "gluteus_maximus_right", 42: "gluteus_medius_left",
    43: "gluteus_medius_right", 44: "gluteus_minimus_left", 45: "gluteus_minimus_right",
    46: "autochthon_left", 47: "autochthon_right", 48: "iliopsoas_left", 49: "iliopsoas_right", 50: "brain",
}
# fmt: on
LUNG = 20  # VISTA3D "lung"
NAME_TO_VISTA = {name: i for i, name in sorted(_TOTAL_MR.items(), reverse=True) if name != "vertebrae"}
NAME_TO_VISTA.update({"lung_left": LUNG, "lung_right": LUNG})

Engine = Callable[[Path, Path, str], None]  # (input image, output label map, device)


class SegmentError(RuntimeError):
    """The engine is missing or failed; the message says what to install or which visit failed."""


def installed_class_map() -> dict[int, str] | None:
    """total_mr numbering of the installed TotalSegmentator, if there is one."""
    try:
        from totalsegmentator.map_to_binary import class_map
    except ImportError:
        return None
    return {int(k): str(v) for k, v in class_map.get("total_mr", {}).items()} or None


def to_vista3d(labels: np.ndarray, class_map: dict[int, str]) -> tuple[np.ndarray, dict[str, int]]:
    """A total_mr label map in VISTA3D ids, and the voxels of every class left out, by name."""
    lut = np.zeros(max(256, int(labels.max()) + 1), dtype=np.uint8)
    for index, name in class_map.items():
        lut[index] = NAME_TO_VISTA.get(name, 0)
    counts = np.bincount(labels.ravel().astype(np.int64), minlength=len(lut))
    dropped = {
        class_map.get(i, f"class {i}"): int(n) for i, n in enumerate(counts) if i and n and lut[i] == 0
    }
    return lut[labels.astype(np.int64)], dropped


def _engine() -> Engine:
    try:
        from totalsegmentator.python_api import totalsegmentator
    except ImportError as exc:
        raise SegmentError(INSTALL) from exc

    def run(image: Path, output: Path, device: str) -> None:
        totalsegmentator(image, output, ml=True, task="total_mr", device=device, quiet=True)

    return run


def segment_root(
    root: Path, device: str = "cpu", force: bool = False, engine: Engine | None = None
) -> list[str]:
    """Label maps for every visit of `root` without one (every visit with `force`)."""
    store = PatientStore(root)
    todo = [
        (pid, vf)
        for pid in store.patient_ids()
        for vf in store.patient(pid).visits
        if force or vf.organs is None
    ]
    if not todo:
        return [f"{root}: every visit has an organ label map (--force to replace them)"]
    run = engine or _engine()
    class_map = installed_class_map() or TOTAL_MR_2_18
    table = LabelTable.vista3d()
    lines = []
    for pid, vf in todo:
        sub = store.patient(pid).subject
        image = vf.channels.get(SEGMENTED_CHANNEL)
        if image is None:
            lines.append(f"problem: {pid} {vf.visit}: no {SEGMENTED_CHANNEL}-phase image to segment")
            continue
        with tempfile.TemporaryDirectory(prefix="case-env-segment-") as tmp:
            output = Path(tmp) / "total_mr.nii.gz"
            try:
                run(image, output, device)
                result = nib.load(output)
            except SegmentError:
                raise
            except Exception as exc:  # the engine's own failures (weights, memory, CUDA)
                if not lines:  # the first visit already fails: the engine, not the visit, is the problem
                    raise SegmentError(
                        f"TotalSegmentator failed on {pid} {vf.visit} ({exc}); {INSTALL}"
                    ) from exc
                lines.append(f"problem: {pid} {vf.visit}: TotalSegmentator failed ({exc})")
                continue
            ras = nib.as_closest_canonical(result)
            labels, dropped = to_vista3d(np.asanyarray(ras.dataobj), class_map)
        reference = store.image(pid, vf.visit, SEGMENTED_CHANNEL)
        if labels.shape != reference.shape or not np.allclose(ras.affine, reference.affine, atol=1e-3):
            lines.append(f"problem: {pid} {vf.visit}: the engine's label map is not on the image grid")
            continue
        save_volume(root / layout.organ_labels(sub, vf.session), labels, reference.affine, is_label=True)
        water, fat = store.image(pid, vf.visit, "water"), store.image(pid, vf.visit, "fat")
        measures = measure(
            labels, reference.voxel_ml, table, water.data, fat.data, store.noise_sigma(pid, vf.visit)
        )
        write_volumes(root / layout.organ_volumes(sub, vf.session), measures)
        left_out = ", ".join(f"{name} ({n} voxels)" for name, n in sorted(dropped.items()))
        lines.append(
            f"{pid} {vf.visit}: {len(measures)} organs"
            + (f"; left out (no VISTA3D id): {left_out}" if left_out else "")
        )
    if not (root / layout.LABEL_TABLE).exists():
        table.write_tsv(root / layout.LABEL_TABLE)
    return lines


def _by_eid(root: Path) -> dict[str, str]:
    try:
        rows = read_tsv(root / layout.PARTICIPANTS)
    except (OSError, TsvError) as exc:
        raise SegmentError(f"{root / layout.PARTICIPANTS}: {exc}") from exc
    return {row["eid"]: row["participant_id"] for row in rows if row.get("eid")}


def copy_derivatives(source: Path, root: Path, force: bool = False) -> list[str]:
    """Label maps, lesion maps and reports of `source` for the visits of `root`, matched by eid."""
    theirs, ours = _by_eid(source), _by_eid(root)
    lines, copied = [], 0
    for eid, sub in sorted(ours.items()):
        src_sub = theirs.get(eid)
        if src_sub is None:
            lines.append(f"problem: eid {eid}: not in {source / layout.PARTICIPANTS}")
            continue
        for ses_dir in sorted((root / sub).glob("ses-*")):
            ses = ses_dir.name
            pairs = [
                (layout.organ_labels(src_sub, ses), layout.organ_labels(sub, ses)),
                (layout.lesion_labels(src_sub, ses), layout.lesion_labels(sub, ses)),
                (layout.lesion_sidecar(src_sub, ses), layout.lesion_sidecar(sub, ses)),
                (layout.report(src_sub, ses, "md"), layout.report(sub, ses, "md")),
                (layout.report(src_sub, ses, "json"), layout.report(sub, ses, "json")),
            ]
            image = nib.load(root / layout.channel_image(sub, ses, "water"))
            label = source / pairs[0][0]
            if not label.exists():
                lines.append(f"problem: {sub} {ses}: {label} does not exist")
                continue
            theirs_img = nib.load(label)
            if theirs_img.shape != image.shape or not np.allclose(theirs_img.affine, image.affine, atol=1e-3):
                lines.append(f"problem: {sub} {ses}: {label.name} is not on the grid of {sub}'s images")
                continue
            for src, dst in pairs:
                target = root / dst
                if (source / src).exists() and (force or not target.exists()):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    text = (source / src).read_bytes()
                    if src.suffix in (".md", ".json"):
                        text = text.replace(src_sub.encode(), sub.encode())
                    target.write_bytes(text)
            copied += 1
    for table in (layout.LABEL_TABLE,):
        if (source / table).exists() and not (root / table).exists():
            (root / table).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / table, root / table)
    lines.append(f"{root}: derivatives of {copied} visits copied from {source}")
    return lines
