"""What a UK Biobank field-20201 download looks like (docs/sources.md, "UK Biobank DICOM").

- Bulk files are named `<eid>_<field>_<instance>_<array>.zip`; field 20201 is the Dixon neck-to-knee
  scan; instance 2 is the first imaging visit and instance 3 the repeat imaging visit (ml4h's
  `ingest_mri_dicoms_zipped`, Langner's inference script, imaging.md §1.1).
- A visit holds 24 series, six stations by four Dixon channels. A public loader refuses a zip without
  exactly 24 series and numbers the stations 1-6 in acquisition order (imaging.md §1.1).
- The channel is the last `_`-separated part of SeriesDescription: `Dixon_noBH_in`, `Dixon_BH_17s_W`:
  in, opp, F, W (`rwindsor1/UKBiobankDXAMRIPreprocessing` `utils.py` splits at the last underscore;
  recoh/pipeline `nifti_series.py` matches the `_w/_f/_in/_opp` endings case-insensitively).
- Slices of a series are ordered by position (SliceLocation in the Windsor loader); stations overlap in z
  and are blended across the overlap with a logistic weight, 1/(1+exp(t)) for t from -5 to 5 over the
  overlapping slices (recoh/pipeline `blend_two_series`), after resampling every station to one slice
  thickness (recoh resamples to 3.0 mm, and Y to 174 rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIELD = 20201
INSTANCE_SESSIONS = {2: "ses-01", 3: "ses-02"}  # first imaging visit, repeat imaging visit
STATIONS = 6
CHANNEL_OF_SUFFIX = {"w": "water", "f": "fat", "in": "in", "opp": "opp"}
SUFFIX_OF_CHANNEL = {"water": "W", "fat": "F", "in": "in", "opp": "opp"}
SERIES = STATIONS * len(CHANNEL_OF_SUFFIX)  # 24

_ZIP = re.compile(r"^(?P<eid>\d+)_(?P<field>\d+)_(?P<instance>\d+)_(?P<array>\d+)\.zip$")


@dataclass(frozen=True)
class BulkFile:
    eid: str
    field: int
    instance: int
    array: int

    @property
    def session(self) -> str:
        return INSTANCE_SESSIONS.get(self.instance, f"ses-{self.instance - 1:02d}")

    def name(self) -> str:
        return f"{self.eid}_{self.field}_{self.instance}_{self.array}.zip"


def parse_bulk_name(name: str) -> BulkFile | None:
    m = _ZIP.match(name)
    if not m:
        return None
    return BulkFile(m["eid"], int(m["field"]), int(m["instance"]), int(m["array"]))


def channel_of(series_description: str) -> str | None:
    """The Dixon channel of a SeriesDescription, or None when it is not a Dixon series."""
    text = series_description.strip()
    if "dixon" not in text.lower() or "_" not in text:
        return None
    return CHANNEL_OF_SUFFIX.get(text.rsplit("_", 1)[1].lower())


def series_description(station: int, channel: str) -> str:
    """What the synthetic zips write: breath-hold for the trunk stations (2-4), free breathing for the
    others. Which stations are breath-held is not in our sources; the ingest does not depend on it."""
    hold = "BH_17s" if 2 <= station <= 4 else "noBH"
    return f"Dixon_{hold}_{SUFFIX_OF_CHANNEL[channel]}"
