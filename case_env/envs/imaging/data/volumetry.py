"""Organ volumetry: one pass over a label map, optional signal fat fraction from the Dixon pair.

Volumes are voxel counts times the voxel volume |det(affine[:3, :3])|. Counting uses chunked `bincount`
over the array's own memory order (docs/sources.md, Volumetry: about 2x faster than one big bincount, 6x faster
than `np.unique`).

Fat fraction is the signal fat fraction F / (W + F) from summed signals per label (two-point Dixon, so not
PDFF; it is called "signal fat fraction" wherever a model can read it). Two corrections keep it honest, as
organ-level Dixon pipelines do: only interior voxels count (partial volume with surrounding fat otherwise
adds several points), and magnitudes are corrected for the Rician noise floor, sqrt(max(M^2 - 2 sigma^2, 0)),
which otherwise adds about 2 points to a fat-free organ at UK Biobank-like SNR.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from case_env.envs.imaging.labels import LabelTable
from case_env.envs.imaging.tsv import read_tsv, write_tsv

_CHUNK = 1 << 20
VOLUME_COLUMNS = ["index", "name", "voxels", "volume_ml", "mean_fatfraction_pct"]


@dataclass(frozen=True)
class OrganMeasure:
    index: int
    organ: str
    voxels: int
    volume_ml: float
    fat_fraction_pct: float | None


def label_counts(labels: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Per-label voxel counts (or weight sums) over all 256 uint8 values, in chunks."""
    order = "F" if labels.flags.f_contiguous and not labels.flags.c_contiguous else "C"
    flat = labels.ravel(order=order)  # no copy in the array's own order
    w = None if weights is None else weights.ravel(order=order)  # same element order, whatever its layout
    out = np.zeros(256, np.float64 if w is not None else np.int64)
    for start in range(0, flat.size, _CHUNK):
        chunk = flat[start : start + _CHUNK]
        if w is None:
            out += np.bincount(chunk, minlength=256)
        else:
            out += np.bincount(chunk, weights=w[start : start + _CHUNK].astype(np.float64), minlength=256)
    return out


def interior(labels: np.ndarray) -> np.ndarray:
    """The label map with every voxel that touches another label (6-neighbourhood) set to 0."""
    out = labels.copy(order="K")
    for ax in range(3):
        lo = tuple(slice(None, -1) if a == ax else slice(None) for a in range(3))
        hi = tuple(slice(1, None) if a == ax else slice(None) for a in range(3))
        edge = labels[lo] != labels[hi]
        out[lo][edge] = 0
        out[hi][edge] = 0
    return out


def _denoised(magnitude: np.ndarray, sigma: float) -> np.ndarray:
    m = magnitude.astype(np.float32)
    if sigma > 0:
        m *= m
        m -= np.float32(2 * sigma * sigma)
        np.maximum(m, 0, out=m)
        np.sqrt(m, out=m)
    return m


MIN_INTERIOR_VOXELS = 8


def fat_fractions(labels: np.ndarray, water: np.ndarray, fat: np.ndarray, sigma: float = 0.0) -> np.ndarray:
    """Signal fat fraction (%) per label value (NaN where undefined), from interior, noise-corrected voxels."""
    core = interior(labels)
    use_core = label_counts(core) >= MIN_INTERIOR_VOXELS
    w, f = _denoised(water, sigma), _denoised(fat, sigma)
    w_all, f_all = label_counts(labels, w), label_counts(labels, f)
    w_core, f_core = label_counts(core, w), label_counts(core, f)
    w_sum = np.where(use_core, w_core, w_all)
    f_sum = np.where(use_core, f_core, f_all)
    total = w_sum + f_sum
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, 100.0 * f_sum / total, np.nan)


def measure(
    labels: np.ndarray,
    voxel_ml: float,
    table: LabelTable,
    water: np.ndarray | None = None,
    fat: np.ndarray | None = None,
    noise_sigma: float = 0.0,
) -> list[OrganMeasure]:
    if labels.dtype != np.uint8:
        raise ValueError(f"label maps must be uint8, got {labels.dtype}")
    counts = label_counts(labels)
    ff = None
    if water is not None and fat is not None:
        ff = fat_fractions(labels, water, fat, noise_sigma)
    out = []
    for index in np.flatnonzero(counts):
        if index == 0:
            continue
        organ_ff = None
        if ff is not None and np.isfinite(ff[index]):
            organ_ff = round(float(ff[index]), 2)
        voxels = int(counts[index])
        out.append(
            OrganMeasure(int(index), table.organ(int(index)), voxels, round(voxels * voxel_ml, 3), organ_ff)
        )
    return out


def write_volumes(path: Path, measures: list[OrganMeasure]) -> None:
    rows = [[m.index, m.organ, m.voxels, m.volume_ml, m.fat_fraction_pct] for m in measures]
    write_tsv(path, VOLUME_COLUMNS, rows)


def read_volumes(path: Path, table: LabelTable) -> list[OrganMeasure]:
    out = []
    for row in read_tsv(path, required=("index", "volume_ml")):
        try:
            index = int(row["index"])
            volume = float(row["volume_ml"])
            voxels = int(row["voxels"]) if row.get("voxels", "n/a") != "n/a" else 0
            ff_text = row.get("mean_fatfraction_pct", "n/a")
            ff = None if ff_text in ("n/a", "") else float(ff_text)
        except ValueError as exc:
            raise ValueError(f"label {row.get('index')!r}: {exc}") from exc
        organ = table.organ(index) if index in table.by_index else (row.get("name") or f"label_{index}")
        out.append(OrganMeasure(index, organ, voxels, volume, ff))
    return out
