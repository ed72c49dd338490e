"""Facts of the UK Biobank neck-to-knee Dixon protocol that both the generator and the loader use.

Six stations, neck to knee, four Dixon reconstructions. Station extents follow the protocol's per-station
slice counts and thicknesses (docs/sources.md, UK Biobank protocol, marked there as recalled rather than
verified), scaled so the overlapping stations tile the 1110 mm stitched volume; for data without station
metadata the same proportions are applied to the volume's own z extent.
"""

from __future__ import annotations

CHANNELS = ("water", "fat", "in", "opp")

STATION_NAMES = (
    "neck and shoulders",
    "thorax",
    "upper abdomen",
    "lower abdomen and pelvis",
    "pelvis and hips",
    "thighs",
)
# Station boundaries as mm below the top of a 1110 mm stitched field of view.
STATION_BOUNDS_BELOW_TOP = (0.0, 172.0, 350.0, 528.0, 706.0, 884.0, 1110.0)


def station_z_ranges(z_bottom: float, z_top: float) -> list[tuple[float, float]]:
    """(z_low, z_high) in mm for stations 1..6 (station 1 at the top) over a volume's z extent."""
    scale = (z_top - z_bottom) / STATION_BOUNDS_BELOW_TOP[-1]
    b = STATION_BOUNDS_BELOW_TOP
    return [(z_top - b[i + 1] * scale, z_top - b[i] * scale) for i in range(len(STATION_NAMES))]
