"""The organ label convention: VISTA3D ids, snake_case organ names, TotalSegmentator names, colours.

Label maps store VISTA3D global ids (1-132, uint8) because that is the vocabulary the CASE banks use and
it is a superset of TotalSegmentator's `total_mr` classes. Tools and questions address organs by the
snake_case form of the VISTA3D name (`right kidney` -> `right_kidney`). A user whose label maps come from
TotalSegmentator writes a `desc-organs_dseg.tsv` with its own indices and names; `organ_name()` maps those
names onto ours, so real data needs no relabelling.

Sources: the VISTA3D label dict as published in MONAI's model-zoo `models/vista3d/docs/labels.json`
(mirrored verbatim in MONAI Label's vista3d config); `total_mr` names from TotalSegmentator 2.18.0
`map_to_binary.py` (both summarised in docs/sources.md, Labels).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from case_env.envs.imaging.tsv import read_tsv, write_tsv

_VISTA3D_NAMES = [
    "liver",
    "kidney",
    "spleen",
    "pancreas",
    "right kidney",
    "aorta",
    "inferior vena cava",
    "right adrenal gland",
    "left adrenal gland",
    "gallbladder",
    "esophagus",
    "stomach",
    "duodenum",
    "left kidney",
    "bladder",
    "prostate or uterus",
    "portal vein and splenic vein",
    "rectum",
    "small bowel",
    "lung",
    "bone",
    "brain",
    "lung tumor",
    "pancreatic tumor",
    "hepatic vessel",
    "hepatic tumor",
    "colon cancer primaries",
    "left lung upper lobe",
    "left lung lower lobe",
    "right lung upper lobe",
    "right lung middle lobe",
    "right lung lower lobe",
    *[f"vertebrae {v}" for v in ("L5", "L4", "L3", "L2", "L1")],
    *[f"vertebrae T{n}" for n in range(12, 0, -1)],
    *[f"vertebrae C{n}" for n in range(7, 0, -1)],
    "trachea",
    "left iliac artery",
    "right iliac artery",
    "left iliac vena",
    "right iliac vena",
    "colon",
    *[f"left rib {n}" for n in range(1, 13)],
    *[f"right rib {n}" for n in range(1, 13)],
    "left humerus",
    "right humerus",
    "left scapula",
    "right scapula",
    "left clavicula",
    "right clavicula",
    "left femur",
    "right femur",
    "left hip",
    "right hip",
    "sacrum",
    "left gluteus maximus",
    "right gluteus maximus",
    "left gluteus medius",
    "right gluteus medius",
    "left gluteus minimus",
    "right gluteus minimus",
    "left autochthon",
    "right autochthon",
    "left iliopsoas",
    "right iliopsoas",
    "left atrial appendage",
    "brachiocephalic trunk",
    "left brachiocephalic vein",
    "right brachiocephalic vein",
    "left common carotid artery",
    "right common carotid artery",
    "costal cartilages",
    "heart",
    "left kidney cyst",
    "right kidney cyst",
    "prostate",
    "pulmonary vein",
    "skull",
    "spinal cord",
    "sternum",
    "left subclavian artery",
    "right subclavian artery",
    "superior vena cava",
    "thyroid gland",
    "vertebrae S1",
    "bone lesion",
    "kidney mass",
    "liver tumor",
    "vertebrae L6",
    "airway",
]
assert len(_VISTA3D_NAMES) == 132

VISTA3D: dict[int, str] = {i + 1: name for i, name in enumerate(_VISTA3D_NAMES)}

# VISTA3D id -> TotalSegmentator total_mr class name (many-to-one for lung lobes and vertebral levels).
_TOTAL_MR = {
    1: "liver",
    3: "spleen",
    4: "pancreas",
    5: "kidney_right",
    6: "aorta",
    7: "inferior_vena_cava",
    8: "adrenal_gland_right",
    9: "adrenal_gland_left",
    10: "gallbladder",
    11: "esophagus",
    12: "stomach",
    13: "duodenum",
    14: "kidney_left",
    15: "urinary_bladder",
    17: "portal_vein_and_splenic_vein",
    19: "small_bowel",
    22: "brain",
    28: "lung_left",
    29: "lung_left",
    30: "lung_right",
    31: "lung_right",
    32: "lung_right",
    58: "iliac_artery_left",
    59: "iliac_artery_right",
    60: "iliac_vena_left",
    61: "iliac_vena_right",
    62: "colon",
    87: "humerus_left",
    88: "humerus_right",
    89: "scapula_left",
    90: "scapula_right",
    91: "clavicula_left",
    92: "clavicula_right",
    93: "femur_left",
    94: "femur_right",
    95: "hip_left",
    96: "hip_right",
    97: "sacrum",
    98: "gluteus_maximus_left",
    99: "gluteus_maximus_right",
    100: "gluteus_medius_left",
    101: "gluteus_medius_right",
    102: "gluteus_minimus_left",
    103: "gluteus_minimus_right",
    104: "autochthon_left",
    105: "autochthon_right",
    106: "iliopsoas_left",
    107: "iliopsoas_right",
    115: "heart",
    118: "prostate",
    121: "spinal_cord",
    **{i: "vertebrae" for i in range(33, 57)},
    127: "vertebrae",
}

# TotalSegmentator names whose VISTA3D counterpart is split finer; they become group organ names.
_TOTAL_MR_GROUPS = {"lung_left": "left_lung", "lung_right": "right_lung", "vertebrae": "vertebrae"}

# Fixed colours for the organs an agent looks at most, so overlays look the same in every image.
_FIXED_COLOURS = {
    1: "#ff8c00",
    3: "#00c8ff",
    4: "#ffff00",
    5: "#ff00ff",
    14: "#b400ff",
    6: "#ff0000",
    7: "#0050ff",
    10: "#00ff00",
    12: "#ffb4b4",
    15: "#00ffc8",
    115: "#ff5050",
    26: "#ff2020",
    116: "#40ffff",
    117: "#40ffff",
    106: "#d2691e",
    107: "#d2691e",
    104: "#cd853f",
    105: "#cd853f",
    98: "#bc8f8f",
    99: "#bc8f8f",
}


_NAMED_COLOURS = {
    "red": (255, 0, 0),
    "light red": (255, 80, 80),
    "orange": (255, 140, 0),
    "yellow": (255, 255, 0),
    "green": (0, 255, 0),
    "aquamarine": (0, 255, 200),
    "cyan": (64, 255, 255),
    "sky blue": (0, 200, 255),
    "blue": (0, 80, 255),
    "violet": (180, 0, 255),
    "magenta": (255, 0, 255),
    "pink": (255, 180, 180),
    "brown": (210, 105, 30),
    "tan": (205, 133, 63),
    "rosy brown": (188, 143, 143),
    "white": (255, 255, 255),
    "grey": (150, 150, 150),
    "olive": (160, 160, 60),
    "lime": (160, 255, 100),
    "purple": (150, 80, 200),
}


@functools.cache
def colour_name(hex_colour: str) -> str:
    """The nearest plain colour name, for legends a model reads ("liver: orange")."""
    rgb = [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]
    return min(
        _NAMED_COLOURS, key=lambda n: sum((a - b) ** 2 for a, b in zip(_NAMED_COLOURS[n], rgb, strict=True))
    )


def snake(name: str) -> str:
    """`right kidney` -> `right_kidney`; `vertebrae L5` -> `vertebrae_l5`."""
    return "_".join(name.lower().replace("-", " ").split())


def _hash_colour(label: int) -> str:
    digest = hashlib.blake2b(f"colour:{label}".encode(), digest_size=3).digest()
    return "#" + "".join(f"{60 + b * 195 // 255:02x}" for b in digest)


def colour_of(label: int) -> str:
    return _FIXED_COLOURS.get(label) or _hash_colour(label)


ORGAN_IDS: dict[str, int] = {snake(name): i for i, name in VISTA3D.items()}
_TOTAL_MR_TO_ORGAN = {
    ts: _TOTAL_MR_GROUPS.get(ts) or snake(VISTA3D[i])
    for i, ts in sorted(_TOTAL_MR.items(), reverse=True)  # lowest id wins a shared name
}


def organ_name(name: str) -> str:
    """Our organ name for a label name in either convention (VISTA3D or TotalSegmentator total_mr)."""
    key = snake(name)
    if key in ORGAN_IDS:
        return key
    return _TOTAL_MR_TO_ORGAN.get(key, key)


@dataclass(frozen=True)
class Label:
    index: int
    organ: str  # snake_case organ name
    totalseg_mr_name: str
    colour: str  # "#rrggbb"


class LabelTable:
    """Index <-> organ lookup for one data root's label maps."""

    def __init__(self, labels: list[Label]):
        self.labels = sorted(labels, key=lambda lab: lab.index)
        self.by_index = {lab.index: lab for lab in self.labels}
        self.by_organ = {lab.organ: lab for lab in self.labels}

    @classmethod
    def vista3d(cls) -> LabelTable:
        return cls([Label(i, snake(name), _TOTAL_MR.get(i, ""), colour_of(i)) for i, name in VISTA3D.items()])

    def organ(self, index: int) -> str:
        lab = self.by_index.get(index)
        return lab.organ if lab else f"label_{index}"

    def write_tsv(self, path: Path) -> None:
        write_tsv(
            path,
            ["index", "name", "totalseg_mr_name", "color"],
            [[lab.index, lab.organ, lab.totalseg_mr_name or "n/a", lab.colour] for lab in self.labels],
        )

    @classmethod
    def read_tsv(cls, path: Path) -> LabelTable:
        """Read a BIDS `dseg.tsv`; `index` and `name` are required, the other columns optional."""
        rows = read_tsv(path, required=("index", "name"))
        labels = []
        for row in rows:
            try:
                index = int(row["index"])
            except ValueError as exc:
                raise ValueError(f"index {row['index']!r} is not an integer") from exc
            if not 0 < index < 256:
                raise ValueError(f"index {index} is outside 1-255 (label maps are uint8)")
            ts = row.get("totalseg_mr_name", "")
            colour = row.get("color", "") or colour_of(index)
            labels.append(Label(index, organ_name(row["name"]), "" if ts == "n/a" else ts, colour))
        return cls(labels)
