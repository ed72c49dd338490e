"""Dixon signal of each tissue: total signal S (adipose = 1000) and fat fraction FF.

Water = S(1 - FF), fat = S * FF, in-phase = W + F, opposed-phase = |W - F|. S follows the spoiled-GRE
steady state S ~ PD sin(a)(1 - E1) / (1 - cos(a) E1) with UK Biobank-like TR 6.69 ms and a 10 degree flip,
from 1.5 T T1 and PD values; the table is taken from docs/sources.md, Phantom. Fat fractions
of liver, pancreas and muscle change per visit and are supplied by the visit state.
"""

from __future__ import annotations

TISSUES: dict[str, tuple[float, float]] = {
    "air": (0.0, 0.0),
    "lung": (60.0, 0.0),
    "adipose": (1000.0, 0.93),
    "muscle": (430.0, 0.04),  # FF replaced per visit
    "liver": (610.0, 0.03),  # FF replaced per visit
    "pancreas": (640.0, 0.05),  # FF replaced per visit
    "spleen": (460.0, 0.005),
    "kidney": (510.0, 0.0),
    "kidney_medulla": (440.0, 0.0),
    "blood": (390.0, 0.0),
    "heart": (400.0, 0.0),
    "urine": (195.0, 0.0),
    "bile": (280.0, 0.0),
    "bowel": (300.0, 0.02),
    "stomach": (300.0, 0.02),
    "marrow": (800.0, 0.45),
    "marrow_femur": (800.0, 0.8),
    "disc": (350.0, 0.0),
    "cord": (420.0, 0.0),
    "cyst": (195.0, 0.0),
    "metastasis": (380.0, 0.0),
    "haemangioma": (900.0, 0.55),
}

TISSUE_NAMES = list(TISSUES)
TISSUE_INDEX = {name: i for i, name in enumerate(TISSUE_NAMES)}
