"""ICD-10 facts the banks need: code shape, chapters, titles, and which diagnoses the images can show.

Chapters are WHO ICD-10's 22 chapters by code range; titles are WHO ICD-10 (2019) wording, for the codes
the synthetic generator uses and the imaging-visible set below. A code outside the title table keeps its
code as its title.

Diagnosis questions are asked only about codes whose finding a neck-to-knee Dixon MRI with its organ
segmentation can show (`IMAGING_VISIBLE`, prefixes): a participant's other codes (hypertension, asthma,
cataract...) are true but cannot be read from the images, so a question about them would test memory of
the record, not evidence seeking. Distractors come from the same chapter, from other participants' codes.
"""

from __future__ import annotations

import re

_CODE = re.compile(r"^([A-Z])(\d{2})(?:\.?(\d{1,2}))?[A-Z+*]?$")

# (first code, last code, chapter number) in WHO ICD-10
CHAPTERS = (
    ("A00", "B99", "I"),
    ("C00", "D48", "II"),
    ("D50", "D89", "III"),
    ("E00", "E90", "IV"),
    ("F00", "F99", "V"),
    ("G00", "G99", "VI"),
    ("H00", "H59", "VII"),
    ("H60", "H95", "VIII"),
    ("I00", "I99", "IX"),
    ("J00", "J99", "X"),
    ("K00", "K93", "XI"),
    ("L00", "L99", "XII"),
    ("M00", "M99", "XIII"),
    ("N00", "N99", "XIV"),
    ("O00", "O99", "XV"),
    ("P00", "P96", "XVI"),
    ("Q00", "Q99", "XVII"),
    ("R00", "R99", "XVIII"),
    ("S00", "T98", "XIX"),
    ("V01", "Y98", "XX"),
    ("Z00", "Z99", "XXI"),
    ("U00", "U99", "XXII"),
)

TITLES = {
    # the synthetic scenarios' codes
    "K76.0": "Fatty (change of) liver, not elsewhere classified",
    "K76.8": "Other specified diseases of liver",
    "C78.7": "Secondary malignant neoplasm of liver and intrahepatic bile duct",
    "N28.1": "Cyst of kidney, acquired",
    "R16.1": "Splenomegaly, not elsewhere classified",
    "K86.8": "Other specified diseases of pancreas",
    "M62.5": "Muscle wasting and atrophy, not elsewhere classified",
    # more imaging-visible codes (distractors of the same chapter)
    "K70.0": "Alcoholic fatty liver",
    "K74.6": "Other and unspecified cirrhosis of liver",
    "K80.2": "Calculus of gallbladder without cholecystitis",
    "K86.1": "Other chronic pancreatitis",
    "C22.0": "Liver cell carcinoma",
    "C64": "Malignant neoplasm of kidney, except renal pelvis",
    "C79.5": "Secondary malignant neoplasm of bone and bone marrow",
    "D73.2": "Chronic congestive splenomegaly",
    "N28.8": "Other specified disorders of kidney and ureter",
    "Q61.3": "Polycystic kidney, unspecified",
    "R16.0": "Hepatomegaly, not elsewhere classified",
    "M62.8": "Other specified disorders of muscle",
    "M48.0": "Spinal stenosis",
    "M51.3": "Other specified intervertebral disc degeneration",
    "N20.0": "Calculus of kidney",
    "N13.3": "Other and unspecified hydronephrosis",
    "R16.2": "Hepatomegaly with splenomegaly, not elsewhere classified",
    "R93.2": "Abnormal findings on diagnostic imaging of liver and biliary tract",
    "C25.9": "Malignant neoplasm of pancreas, unspecified",
    # common codes the images cannot show (the synthetic table's incidental diagnoses)
    "I10": "Essential (primary) hypertension",
    "E78.0": "Pure hypercholesterolaemia",
    "E11.9": "Type 2 diabetes mellitus without complications",
    "J45.9": "Asthma, unspecified",
    "K21.9": "Gastro-oesophageal reflux disease without oesophagitis",
    "H25.9": "Senile cataract, unspecified",
    "F32.9": "Depressive episode, unspecified",
    "G47.3": "Sleep apnoea",
}
INCIDENTAL = ("I10", "E78.0", "E11.9", "J45.9", "K21.9", "H25.9", "F32.9", "G47.3")

# Code prefixes whose finding the Dixon images and organ segmentation can show.
# fmt: off
IMAGING_VISIBLE = (
    "K70.0", "K74", "K76.0", "K76.8", "K80", "K86", "C22", "C25", "C64", "C78.7", "C79.5", "D73",
    "N13.3", "N20", "N28.1", "N28.8", "Q61", "R16", "R93.2", "M48.0", "M51.3", "M62.5", "M62.8",
)
# fmt: on


def normalise_code(text: str) -> str | None:
    """`K760`, `k76.0`, `K76.0` -> `K76.0`; `I10` -> `I10`; None when it is not an ICD-10 code."""
    m = _CODE.match(text.strip().upper())
    if not m:
        return None
    letter, category, sub = m.groups()
    return f"{letter}{category}.{sub}" if sub else f"{letter}{category}"


def chapter_of(code: str) -> str:
    """WHO chapter (roman numeral) of a code; "" when no chapter's range holds it."""
    head = code[:3]
    return next((ch for first, last, ch in CHAPTERS if first <= head <= last), "")


def title_of(code: str) -> str:
    return TITLES.get(code) or TITLES.get(code.split(".")[0]) or code


def imaging_visible(code: str) -> bool:
    return code.startswith(IMAGING_VISIBLE)


def label(code: str, title: str) -> str:
    """How an option names a diagnosis."""
    return f"{code} {title}" if title != code else code
