"""File names of the BIDS-like data layout (docs/data.md, "Data layout").

The generator writes exactly these names; the reader (`index.py`) accepts these and the real-data variants
users bring (`.nii`, UK Biobank channel suffixes, missing optional files).
"""

from __future__ import annotations

from pathlib import Path

SEGMENTATIONS = Path("derivatives") / "segmentations"
REPORTS = Path("derivatives") / "reports"
LABEL_TABLE = SEGMENTATIONS / "desc-organs_dseg.tsv"
PARTICIPANTS = Path("participants.tsv")
DATASET_DESCRIPTION = Path("dataset_description.json")


def sessions_tsv(sub: str) -> Path:
    return Path(sub) / f"{sub}_sessions.tsv"


def anat_dir(sub: str, ses: str) -> Path:
    return Path(sub) / ses / "anat"


def channel_image(sub: str, ses: str, channel: str) -> Path:
    return anat_dir(sub, ses) / f"{sub}_{ses}_acq-dixon_rec-{channel}_T1w.nii.gz"


def phantom_manifest(sub: str, ses: str) -> Path:
    return Path(sub) / ses / f"{sub}_{ses}_phantom.json"


def segmentation_dir(sub: str, ses: str) -> Path:
    return SEGMENTATIONS / sub / ses / "anat"


def organ_labels(sub: str, ses: str) -> Path:
    return segmentation_dir(sub, ses) / f"{sub}_{ses}_acq-dixon_desc-organs_dseg.nii.gz"


def lesion_labels(sub: str, ses: str) -> Path:
    return segmentation_dir(sub, ses) / f"{sub}_{ses}_acq-dixon_desc-lesions_dseg.nii.gz"


def lesion_sidecar(sub: str, ses: str) -> Path:
    return segmentation_dir(sub, ses) / f"{sub}_{ses}_acq-dixon_desc-lesions_dseg.json"


def organ_volumes(sub: str, ses: str) -> Path:
    return segmentation_dir(sub, ses) / f"{sub}_{ses}_acq-dixon_desc-organs_volumes.tsv"


def report(sub: str, ses: str, ext: str) -> Path:
    return REPORTS / sub / ses / f"{sub}_{ses}_desc-radiology_report.{ext}"
