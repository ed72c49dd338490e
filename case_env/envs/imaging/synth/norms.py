"""Adult reference ranges the generator aims inside (mL), for organs whose size a question may ask about.

Wide physiological bounds around the typical values of docs/sources.md, Organ volumes and change: liver
1.3-1.9 L (CT 1281 +- 219 mL, Jasper 2019); spleen 150-250 mL, splenomegaly above about 315-400 mL
(Caglar 2014, Prassopoulos 1997); kidney 130-180 mL each; pancreas 50-90 mL; gallbladder 15-60 mL; heart
with blood 500-800 mL (about 400 in small women); bladder 50-500 mL. Bounds are widened by the two-year changes the scenarios apply.
"""

from __future__ import annotations

ADULT_RANGES_ML: dict[str, tuple[float, float]] = {
    "liver": (1000.0, 2300.0),
    "spleen": (100.0, 320.0),  # outside the splenomegaly scenario's follow-up
    "pancreas": (40.0, 110.0),
    "left_kidney": (90.0, 250.0),
    "right_kidney": (90.0, 250.0),
    "gallbladder": (10.0, 80.0),
    "heart": (400.0, 950.0),  # small women reach about 400 mL
    "bladder": (50.0, 500.0),
}
SPLENOMEGALY_ML = 315.0

# Organs big enough for a volume question. Thin tubes (vessels, spinal cord) and single vertebrae are
# landmarks: at 4.5 mm their voxel volumes differ between profiles by up to about 9 %.
MEASURED_ORGANS = (
    "liver",
    "spleen",
    "pancreas",
    "left_kidney",
    "right_kidney",
    "gallbladder",
    "stomach",
    "heart",
    "bladder",
    "left_iliopsoas",
    "right_iliopsoas",
    "left_autochthon",
    "right_autochthon",
    "left_gluteus_maximus",
    "right_gluteus_maximus",
)
