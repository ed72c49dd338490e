"""Voxel grids in the scanner (RAS+) frame, and the two generation profiles.

The frame is physical, not grid-bound: x and y are centred on the table axis, z runs from the knee end of
the field of view (0 mm) to the neck (1110 mm). Anatomy is placed in millimetres, so the `full` and `ci`
profiles sample the same continuous phantom and their organ volumes agree.

Geometry of `full` is the stitched UK Biobank neck-to-knee Dixon volume (224 x 174 x 370 at
2.232 x 2.232 x 3.0 mm; recoh/pipeline README, Basty et al. 2020, arXiv:2007.01251); `ci` halves the
resolution on every axis over the same field of view.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from case_env.envs.imaging import scan_protocol as protocol
from case_env.envs.imaging.scan_protocol import STATION_NAMES

__all__ = ["FOV_MM", "PROFILES", "STATION_NAMES", "TOP_MM", "Box", "Grid", "station_z_ranges"]

Box = tuple[tuple[float, float], tuple[float, float], tuple[float, float]]

FOV_MM = (224 * 2.232, 174 * 2.232, 370 * 3.0)
TOP_MM = FOV_MM[2]  # z of the top (neck end) of the field of view


@dataclass(frozen=True)
class Grid:
    """A regular grid; `origin` is the centre of voxel (0, 0, 0) in mm."""

    shape: tuple[int, int, int]
    spacing: tuple[float, float, float]
    origin: tuple[float, float, float]

    @classmethod
    def covering_fov(cls, shape: tuple[int, int, int]) -> Grid:
        spacing = tuple(round(f / n, 6) for f, n in zip(FOV_MM, shape, strict=True))
        origin = (
            -FOV_MM[0] / 2 + spacing[0] / 2,
            -FOV_MM[1] / 2 + spacing[1] / 2,
            spacing[2] / 2,
        )
        return cls(shape, spacing, tuple(round(o, 6) for o in origin))  # type: ignore[arg-type]

    @classmethod
    def around(cls, box: Box, spacing: float) -> Grid:
        """An isotropic grid covering `box` (used for profile-independent reference computations)."""
        shape = tuple(max(1, int(np.ceil((hi - lo) / spacing))) for lo, hi in box)
        origin = tuple(lo + spacing / 2 for lo, _ in box)
        return cls(shape, (spacing,) * 3, origin)  # type: ignore[arg-type]

    @property
    def affine(self) -> np.ndarray:
        aff = np.diag([*self.spacing, 1.0])
        aff[:3, 3] = self.origin
        return aff

    @property
    def voxel_ml(self) -> float:
        return float(np.prod(self.spacing)) / 1000.0

    def axis(self, ax: int) -> np.ndarray:
        return self.origin[ax] + np.arange(self.shape[ax]) * self.spacing[ax]

    def index_slices(self, box: Box) -> tuple[slice, slice, slice] | None:
        """Voxels whose centres fall inside `box`; None when the box misses the grid."""
        out = []
        for ax, (lo, hi) in enumerate(box):
            first = int(np.ceil((lo - self.origin[ax]) / self.spacing[ax]))
            last = int(np.floor((hi - self.origin[ax]) / self.spacing[ax]))
            first, last = max(first, 0), min(last, self.shape[ax] - 1)
            if last < first:
                return None
            out.append(slice(first, last + 1))
        return tuple(out)  # type: ignore[return-value]

    def coords(self, slices: tuple[slice, slice, slice]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Broadcastable coordinate vectors (nx,1,1), (1,ny,1), (1,1,nz) for a sub-block."""
        x, y, z = (self.axis(ax)[slices[ax]] for ax in range(3))
        return x[:, None, None], y[None, :, None], z[None, None, :]


PROFILES: dict[str, Grid] = {
    "full": Grid.covering_fov((224, 174, 370)),
    "ci": Grid.covering_fov((112, 87, 185)),
}


def station_z_ranges() -> list[tuple[float, float]]:
    """(z_low, z_high) in mm for stations 1..6 of the generated field of view."""
    return protocol.station_z_ranges(0.0, TOP_MM)
