"""Stations of a neck-to-knee scan as DICOM series see them, and stitching them into one volume.

A `Station` is one series in its own frame: `data[column, row, slice]`, the DICOM row and column
direction cosines (ImageOrientationPatient), the pixel spacing and each slice's ImagePositionPatient, all
in DICOM's LPS patient coordinates. `stitch` puts the stations of one channel on a common grid:

- every station must share the orientation and the in-plane pixel spacing (else: inconsistent geometry);
- in plane, the grid is the union of the stations' fields of view; a station's offset must fall on the
  pixel grid (stations of a UK Biobank visit differ in their anterior-posterior extent, 168 or 174 rows);
- along the slice normal, the grid runs from the lowest to the highest slice at the reference slice
  spacing (the finest station's unless given); a station with another spacing is resampled, linearly for
  images and to the nearest slice for label maps;
- where two stations overlap they are blended with recoh/pipeline's logistic weight (the lower station's
  weight 1/(1+exp(t)), t from -5 to 5 across the overlap); label maps take the station whose weight is
  larger. A slice no station covers is an error, not a black band.

On identical overlapping data (the synthetic zips) blending returns the same values, so a volume split
into stations and stitched again is reproduced exactly; a resampled station is within linear
interpolation of its neighbours' slices (docs/data.md, "How the modules fit").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
ORIENTATION_TOLERANCE = 1e-3  # direction cosines
SPACING_TOLERANCE = 1e-3  # relative
GRID_TOLERANCE = 0.05  # pixels: how far an offset may be from the pixel grid


class GeometryError(ValueError):
    """Stations that cannot be put on one grid; the message names the station and what disagrees."""


@dataclass
class Station:
    data: np.ndarray  # (columns, rows, slices)
    row_dir: np.ndarray  # direction of increasing column index (IOP[0:3])
    col_dir: np.ndarray  # direction of increasing row index (IOP[3:6])
    spacing: tuple[float, float]  # (between columns, between rows) mm; DICOM PixelSpacing reversed
    positions: np.ndarray  # (slices, 3) ImagePositionPatient, ordered along the normal
    label: str = "station"
    facts: dict = field(default_factory=dict)  # acquisition facts for the sidecar

    @property
    def normal(self) -> np.ndarray:
        return np.cross(self.row_dir, self.col_dir)

    def along(self) -> np.ndarray:
        return self.positions @ self.normal

    def step(self) -> float:
        w = self.along()
        return float(np.median(np.diff(w))) if len(w) > 1 else float(self.facts.get("SliceThickness", 1.0))


@dataclass
class Stitched:
    data: np.ndarray  # (columns, rows, slices) in the stations' frame
    affine_ras: np.ndarray  # voxel -> RAS mm, for nibabel
    ranges: list[
        tuple[float, float]
    ]  # per station (input order): where it has the larger weight, along the normal


def _check(stations: list[Station]) -> None:
    if not stations:
        raise GeometryError("no stations to stitch")
    first = stations[0]
    for s in stations:
        if abs(float(s.row_dir @ s.col_dir)) > ORIENTATION_TOLERANCE:
            raise GeometryError(f"{s.label}: row and column directions are not orthogonal")
        if not (
            np.allclose(s.row_dir, first.row_dir, atol=ORIENTATION_TOLERANCE)
            and np.allclose(s.col_dir, first.col_dir, atol=ORIENTATION_TOLERANCE)
        ):
            iop = [round(float(x), 4) for x in (*s.row_dir, *s.col_dir)]
            ref = [round(float(x), 4) for x in (*first.row_dir, *first.col_dir)]
            raise GeometryError(f"{s.label}: orientation {iop} differs from {first.label}'s {ref}")
        if not np.allclose(s.spacing, first.spacing, rtol=SPACING_TOLERANCE):
            raise GeometryError(
                f"{s.label}: pixel spacing {s.spacing[1]:g} x {s.spacing[0]:g} mm differs from "
                f"{first.label}'s {first.spacing[1]:g} x {first.spacing[0]:g} mm"
            )
        w = s.along()
        if len(w) > 1:
            steps = np.diff(w)
            if steps.min() <= 0 or (steps.max() - steps.min()) > 0.01 * abs(float(np.median(steps))):
                raise GeometryError(
                    f"{s.label}: uneven slice spacing ({steps.min():.3g}-{steps.max():.3g} mm)"
                )
        in_plane = s.positions @ np.stack([s.row_dir, s.col_dir], axis=1)
        if np.ptp(in_plane, axis=0).max() > GRID_TOLERANCE * min(s.spacing):
            raise GeometryError(f"{s.label}: slices are not stacked along the normal (shifted in plane)")


def _sample(station: Station, at: np.ndarray, order: int) -> np.ndarray:
    """The station's slices at positions `at` along the normal (inside its extent)."""
    w = station.along()
    t = (at - w[0]) / station.step() if len(w) > 1 else np.zeros_like(at)
    t = np.clip(t, 0, station.data.shape[2] - 1)
    t = np.where(np.abs(t - np.rint(t)) < 1e-6, np.rint(t), t)  # on a slice: that slice, exactly
    if order == 0:
        return station.data[:, :, np.rint(t).astype(int)]
    lo = np.floor(t).astype(int)
    hi = np.minimum(lo + 1, station.data.shape[2] - 1)
    frac = (t - lo).astype(np.float32)
    if not frac.any():  # the station is on the grid: its own slices, in its own dtype
        return station.data[:, :, lo]
    return station.data[:, :, lo] * (1 - frac) + station.data[:, :, hi] * frac


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Blended or interpolated values in the stations' dtype (rounded and clipped for integers)."""
    if values.dtype == dtype or not np.issubdtype(dtype, np.integer):
        return values.astype(dtype, copy=False)
    info = np.iinfo(dtype)
    return np.clip(np.rint(values), info.min, info.max).astype(dtype)


def _in_plane(stations: list[Station]) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """In plane, the union of the fields of view: each station's position along the rows and columns (mm)
    and its offset in whole pixels, which must fall on the first station's pixel grid."""
    first = stations[0]
    col_mm, row_mm = first.spacing
    u = np.array([float(s.positions[0] @ first.row_dir) for s in stations])
    v = np.array([float(s.positions[0] @ first.col_dir) for s in stations])
    shifts = []
    for s, du, dv in zip(stations, (u - u.min()) / col_mm, (v - v.min()) / row_mm, strict=True):
        if abs(du - round(du)) > GRID_TOLERANCE or abs(dv - round(dv)) > GRID_TOLERANCE:
            raise GeometryError(
                f"{s.label}: its in-plane offset ({du:.2f}, {dv:.2f} pixels) is off the pixel grid"
            )
        shifts.append((round(du), round(dv)))
    return u, v, shifts


def _along_normal(stations: list[Station], step: float) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Along the normal, one grid from the lowest slice to the highest: the slices each station covers (in
    input order) and each station's blending weight per slice, a sigmoid across each overlap."""
    w_min = min(s.along()[0] for s in stations)
    w_max = max(s.along()[-1] for s in stations)
    n = round((w_max - w_min) / step) + 1
    grid = w_min + step * np.arange(n)
    eps = 1e-3 * step
    covered = [(grid >= s.along()[0] - eps) & (grid <= s.along()[-1] + eps) for s in stations]
    weights = np.zeros((len(stations), n))
    for i in range(len(stations)):
        weights[i, covered[i]] = 1.0
    by_position = sorted(range(len(stations)), key=lambda i: stations[i].along()[0])
    for a, b in itertools.pairwise(by_position):
        both = np.nonzero(covered[a] & covered[b])[0]
        if len(both):
            lower = 1.0 / (1.0 + np.exp(np.linspace(-5, 5, len(both))))
            weights[a, both], weights[b, both] = lower, 1.0 - lower
    if (np.add.reduce([c.astype(int) for c in covered]) > 2).any():
        raise GeometryError("three stations overlap at one slice; expected a chain of stations")
    if (weights.sum(axis=0) == 0).any():
        gap = grid[weights.sum(axis=0) == 0]
        raise GeometryError(f"no station covers {gap[0]:.1f}-{gap[-1]:.1f} mm along the slice normal")
    return grid, covered, weights


def stitch(stations: list[Station], order: int = 1, slice_mm: float | None = None) -> Stitched:
    """One volume from the stations of one channel (order 1 for images, 0 for label maps)."""
    _check(stations)
    first = stations[0]
    row_dir, col_dir, normal = first.row_dir, first.col_dir, first.normal
    col_mm, row_mm = first.spacing
    step = slice_mm or min(s.step() for s in stations)
    u, v, shifts = _in_plane(stations)
    columns = max(dc + s.data.shape[0] for s, (dc, _) in zip(stations, shifts, strict=True))
    rows = max(dr + s.data.shape[1] for s, (_, dr) in zip(stations, shifts, strict=True))
    grid, covered, weights = _along_normal(stations, step)
    n, w_min = len(grid), grid[0]

    # Slices one station covers are copied; only the overlaps are blended, in float32, with the weights
    # renormalised where a station's in-plane field of view is the smaller one.
    dtype = first.data.dtype
    out = np.zeros((columns, rows, n), dtype=dtype)
    shared = np.nonzero((weights > 0).sum(axis=0) > 1)[0]
    slot = {int(k): j for j, k in enumerate(shared)}
    best = weights.argmax(axis=0)
    if order != 0:
        acc = np.zeros((columns, rows, len(shared)), dtype=np.float32)
        total = np.zeros_like(acc)
    for i, (s, (dc, dr)) in enumerate(zip(stations, shifts, strict=True)):
        ks = np.nonzero(covered[i])[0]
        if not len(ks):
            continue
        part = _sample(s, grid[ks], order)
        box = (slice(dc, dc + s.data.shape[0]), slice(dr, dr + s.data.shape[1]))
        alone = ~np.isin(ks, shared)
        out[box[0], box[1], ks[alone]] = _cast(part[:, :, alone], dtype)
        if order == 0:
            mine = np.isin(ks, shared) & (best[ks] == i)
            out[box[0], box[1], ks[mine]] = part[:, :, mine]
        elif (~alone).any():
            js = [slot[int(k)] for k in ks[~alone]]
            w = weights[i, ks[~alone]].astype(np.float32)
            acc[box[0], box[1], js] += part[:, :, ~alone] * w
            total[box[0], box[1], js] += w
    if order != 0 and len(shared):
        out[:, :, shared] = _cast(np.divide(acc, total, out=np.zeros_like(acc), where=total > 0), dtype)

    origin = u.min() * row_dir + v.min() * col_dir + w_min * normal
    affine_lps = np.eye(4)
    affine_lps[:3, 0], affine_lps[:3, 1], affine_lps[:3, 2] = (
        row_dir * col_mm,
        col_dir * row_mm,
        normal * step,
    )
    affine_lps[:3, 3] = origin
    ranges = []
    for i in range(len(stations)):
        mine = grid[weights[i] >= np.max(weights, axis=0) - 1e-12]
        ranges.append((float(mine.min()), float(mine.max())) if len(mine) else (0.0, 0.0))
    return Stitched(out, LPS_TO_RAS @ affine_lps, ranges)


def split(
    volume: np.ndarray,
    affine_ras: np.ndarray,
    z_ranges: list[tuple[float, float]],
    overlap: int,
    crop_rows: dict[int, tuple[int, int]] | None = None,
) -> list[Station]:
    """Stations of an axial RAS volume (diagonal affine), as a scanner would write them: station 1 at
    the top, neighbouring stations sharing `overlap` slices around each boundary (so the overlap's
    midpoint stays at the boundary), standard axial orientation (IOP 1,0,0 / 0,1,0 in LPS). `crop_rows`
    drops (anterior, posterior) rows per station."""
    if (
        not np.allclose(affine_ras[:3, :3], np.diag(np.diag(affine_ras[:3, :3])))
        or (np.diag(affine_ras)[:3] <= 0).any()
    ):
        raise ValueError("split needs a RAS+ volume with a diagonal affine")
    dx, dy, dz = np.diag(affine_ras)[:3]
    nx, ny, nz = volume.shape
    frame = volume[::-1, ::-1, :]  # columns run to patient left (+x LPS), rows to posterior (+y LPS)
    z = affine_ras[2, 3] + dz * np.arange(nz)
    x0 = -(affine_ras[0, 3] + (nx - 1) * dx)
    y0 = -(affine_ras[1, 3] + (ny - 1) * dy)
    stations = []
    for number, (low, high) in enumerate(z_ranges, start=1):
        inside = np.nonzero((z >= low - 1e-6) & (z < high - 1e-6))[0]
        if number == len(z_ranges):  # the lowest station reaches the bottom of the volume
            inside = np.nonzero(z < high - 1e-6)[0]
        if number == 1:
            inside = np.nonzero(z >= low - 1e-6)[0]
        below, above = overlap // 2, overlap - overlap // 2
        k0 = max(int(inside[0]) - (below if number < len(z_ranges) else 0), 0)
        k1 = min(int(inside[-1]) + 1 + (above if number > 1 else 0), nz)
        top, bottom = (crop_rows or {}).get(number, (0, 0))
        data = np.ascontiguousarray(frame[:, top : ny - bottom, k0:k1])
        positions = np.stack([np.full(k1 - k0, x0), np.full(k1 - k0, y0 + top * dy), z[k0:k1]], axis=1)
        stations.append(
            Station(
                data,
                np.array([1.0, 0.0, 0.0]),
                np.array([0.0, 1.0, 0.0]),
                (float(dx), float(dy)),
                positions,
                f"station {number}",
            )
        )
    return stations
