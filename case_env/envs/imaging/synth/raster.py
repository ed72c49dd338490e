"""Turn shapes into label and tissue volumes, or query them at points.

`true_volumes_ml` integrates each label over the continuous phantom with a fixed low-discrepancy point set
(Halton, no random generator), so the manifest's volumes are independent of the voxel grid: the measured
label-map volumes of both profiles are checked against them, not against themselves.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from case_env.envs.imaging.synth.anatomy import Shape
from case_env.envs.imaging.synth.geometry import Box, Grid
from case_env.envs.imaging.synth.tissues import TISSUE_INDEX


def rasterize(shapes: Iterable[Shape], grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """(labels uint8, tissue index uint8), Fortran-ordered like nibabel's arrays."""
    labels = np.zeros(grid.shape, np.uint8, order="F")
    tissue = np.zeros(grid.shape, np.uint8, order="F")
    for shape in shapes:
        block = grid.index_slices(shape.box)
        if block is None:
            continue
        X, Y, Z = grid.coords(block)
        block_shape = tuple(s.stop - s.start for s in block)
        mask = np.broadcast_to(shape.inside(X, Y, Z), block_shape)
        if not mask.any():
            continue
        tissue[block][mask] = TISSUE_INDEX[shape.tissue]
        if shape.label is None:
            continue
        if shape.label_at is not None:
            labels[block][mask] = np.broadcast_to(shape.label_at(X, Y, Z), block_shape)[mask]
        else:
            labels[block][mask] = shape.label
    return labels, tissue


def label_points(shapes: Iterable[Shape], points: np.ndarray) -> np.ndarray:
    """Label at each (x, y, z) point after all shapes are drawn in order."""
    out = np.zeros(len(points), np.int16)
    shapes = list(shapes)
    while shapes and shapes[0].label == 0:  # leading background shapes cannot change an all-zero start
        shapes.pop(0)
    for shape in shapes:
        if shape.label is None:
            continue
        (x0, x1), (y0, y1), (z0, z1) = shape.box
        sel = np.flatnonzero(
            (points[:, 0] >= x0)
            & (points[:, 0] <= x1)
            & (points[:, 1] >= y0)
            & (points[:, 1] <= y1)
            & (points[:, 2] >= z0)
            & (points[:, 2] <= z1)
        )
        if sel.size == 0:
            continue
        X, Y, Z = points[sel, 0], points[sel, 1], points[sel, 2]
        mask = np.broadcast_to(shape.inside(X, Y, Z), sel.shape)
        if shape.label_at is not None:
            out[sel[mask]] = np.broadcast_to(shape.label_at(X, Y, Z), sel.shape)[mask]
        else:
            out[sel[mask]] = shape.label
    return out


def halton(n: int, dims: int = 3) -> np.ndarray:
    """The first n points of the Halton sequence in [0, 1)^dims (bases 2, 3, 5, ...)."""
    bases = [2, 3, 5, 7, 11][:dims]
    out = np.zeros((n, dims))
    for d, base in enumerate(bases):
        index = np.arange(1, n + 1)
        frac, value = 1.0, np.zeros(n)
        while index.any():
            frac /= base
            value += frac * (index % base)
            index //= base
        out[:, d] = value
    return out


_UNIT_POINTS = halton(1 << 16)


def _intersects(a: Box, b: Box) -> bool:
    return all(lo1 <= hi2 and lo2 <= hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b, strict=True))


def true_volumes_ml(shapes: list[Shape], labels: Iterable[int], fov: Box) -> dict[int, float]:
    """Volume of each label in the continuous phantom, clipped to the field of view."""
    out = {}
    for label in labels:
        owners = [s for s in shapes if label in s.labels]
        if not owners:
            continue
        box = tuple(
            (
                max(min(s.box[ax][0] for s in owners), fov[ax][0]),
                min(max(s.box[ax][1] for s in owners), fov[ax][1]),
            )
            for ax in range(3)
        )
        lo = np.array([b[0] for b in box])
        hi = np.array([b[1] for b in box])
        points = lo + _UNIT_POINTS * (hi - lo)
        relevant = [s for s in shapes if s.label is not None and _intersects(s.box, box)]
        hit = np.count_nonzero(label_points(relevant, points) == label)
        out[label] = float(np.prod(hi - lo)) * hit / len(points) / 1000.0
    return out


def supersampled(grid: Grid, factor: int) -> Grid:
    """The grid with `factor` sub-voxels per axis, covering the same field of view."""
    if factor == 1:
        return grid
    spacing = tuple(s / factor for s in grid.spacing)
    origin = tuple(o - s / 2 + f / 2 for o, s, f in zip(grid.origin, grid.spacing, spacing, strict=True))
    shape = tuple(n * factor for n in grid.shape)
    return Grid(shape, spacing, origin)  # type: ignore[arg-type]


def _blocks(a: np.ndarray, factor: int) -> list[np.ndarray]:
    """The factor**3 sub-voxel views of a Fortran-ordered fine array, each on the coarse grid."""
    nx, ny, nz = (n // factor for n in a.shape)
    v = a.reshape((factor, nx, factor, ny, factor, nz), order="F")
    return [v[i, :, j, :, k, :] for k in range(factor) for j in range(factor) for i in range(factor)]


def downsample_labels(labels: np.ndarray, factor: int) -> np.ndarray:
    """Labels on a grid `factor` times coarser that keep every label's volume.

    A majority vote shrinks convex organs (a boundary voxel of a curved surface is more often under half
    inside than over): 1-3 % for a heart or pancreas at 4.5 mm, more for a gallbladder. Instead, boundary
    voxels are labelled by multi-class error diffusion: walking the boundary in memory order, each voxel
    takes the label maximising (its share here + that label's running shortfall), so every label's voxel
    count stays within about one voxel of its exact sub-voxel volume, and voxels go where shares are high.
    """
    if factor == 1:
        return labels
    n_sub = factor**3
    subs = _blocks(labels, factor)
    out = np.asfortranarray(subs[0])
    mixed = np.zeros(out.shape, bool)
    for other in subs[1:]:
        mixed |= other != out
    where = np.nonzero(mixed)
    m = where[0].size
    if m == 0:
        return out
    # One entry per (boundary voxel, label present in it) with the label's sub-voxel count, voxel-major.
    values = np.sort(np.stack([sub[where] for sub in subs]), axis=0)  # (n_sub, m)
    starts = np.ones(values.shape, bool)
    starts[1:] = values[1:] != values[:-1]
    row, voxel = np.nonzero(starts)
    order = np.lexsort((row, voxel))
    row, voxel = row[order], voxel[order]
    next_row = np.append(row[1:], n_sub)
    next_row[np.append(voxel[1:] != voxel[:-1], True)] = n_sub
    share = ((next_row - row) / n_sub).tolist()
    label = values[row, voxel].tolist()
    bounds = [*np.flatnonzero(np.append(True, voxel[1:] != voxel[:-1])).tolist(), len(label)]

    shortfall = [0.0] * 256
    assigned = np.empty(m, np.uint8)
    for j in range(m):
        lo, hi = bounds[j], bounds[j + 1]
        best, best_score = label[lo], -1e9
        for k in range(lo, hi):
            score = share[k] + shortfall[label[k]]
            if score > best_score:
                best, best_score = label[k], score
        for k in range(lo, hi):
            shortfall[label[k]] += share[k]
        shortfall[best] -= 1.0
        assigned[j] = best
    out[where] = assigned
    return out


def rasterize_lesions(shapes: Iterable[Shape], grid: Grid, factor: int) -> np.ndarray:
    """Instance map of disjoint shapes: a voxel belongs to a shape covering at least half its sub-voxels."""
    out = np.zeros(grid.shape, np.uint8, order="F")
    offsets = (np.arange(factor) + 0.5) / factor - 0.5
    for shape in shapes:
        block = grid.index_slices(
            tuple((lo - grid.spacing[ax], hi + grid.spacing[ax]) for ax, (lo, hi) in enumerate(shape.box))
        )
        if block is None:
            continue
        X, Y, Z = grid.coords(block)
        cover = np.zeros(tuple(s.stop - s.start for s in block), np.float32)
        for dx in offsets:
            for dy in offsets:
                for dz in offsets:
                    sub = (X + dx * grid.spacing[0], Y + dy * grid.spacing[1], Z + dz * grid.spacing[2])
                    cover += shape.inside(*sub)
        out[block][cover >= factor**3 / 2] = shape.label
    return out


def block_mean(values: np.ndarray, factor: int) -> np.ndarray:
    """Average of each block of sub-voxels (partial volume)."""
    if factor == 1:
        return values
    subs = _blocks(values, factor)
    out = np.zeros(subs[0].shape, np.float32, order="F")
    for sub in subs:
        out += sub
    out *= 1.0 / len(subs)
    return out
