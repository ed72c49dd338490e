"""The imaging environment's vocabulary: its personas, visits and Dixon sequences (CASE's names)."""

from __future__ import annotations

from enum import StrEnum


class Persona(StrEnum):
    ANATOMIST = "anatomist"
    RADIOLOGIST = "radiologist"
    CONSULTANT = "consultant"


PERSONAS = tuple(Persona)


class Visit(StrEnum):
    BASELINE = "baseline"
    FOLLOW_UP = "follow_up"


class Sequence(StrEnum):
    WATER = "water"
    FAT = "fat"
    IN_PHASE = "in"
    OPPOSED_PHASE = "opp"


# Organs listed first when a model asks for one that does not exist.
COMMON_ORGANS = (
    "liver",
    "spleen",
    "pancreas",
    "left_kidney",
    "right_kidney",
    "gallbladder",
    "stomach",
    "heart",
    "bladder",
    "aorta",
    "inferior_vena_cava",
    "left_iliopsoas",
    "right_iliopsoas",
)


class ImagingFault(StrEnum):
    """Model faults of the imaging tools, beside the shared ones (`case_env.core.tools.ErrorCode`)."""

    UNKNOWN_ORGAN = "unknown_organ"
    UNKNOWN_VISIT = "unknown_visit"
