"""The naive reference engine of `case-env bench server --baseline naive`.

The same tools, routes and wire format, computed the way a first version usually is: every call loads the
`.nii.gz` files it needs with nibabel's `get_fdata()` (float64, reoriented to RAS+ on every call), keeps no
decoded volume, window, organ extent or volumetry between calls, computes intensity windows from every voxel
and encodes PNGs at Pillow's default compression. Served by the same app factory and uvicorn settings, so the
benchmark's ratio measures the engine, not the HTTP stack.

    uvicorn case_env.envs.imaging.bench.naive:create_app --factory
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
from fastapi import FastAPI

from case_env.core.cache import Memo
from case_env.core.resident import require_resident
from case_env.envs.imaging.data.nifti import Volume
from case_env.envs.imaging.data.store import PatientStore, _as_labels
from case_env.envs.imaging.data.volumetry import OrganMeasure, measure
from case_env.envs.imaging.viewer import render
from case_env.envs.imaging.viewer.render import Window
from case_env.envs.imaging.viewer.service import Imaging

PILLOW_DEFAULT_PNG_LEVEL = 6  # Pillow's zlib default when no compress_level is given


class NaiveStore(PatientStore):
    def _load(self, path: Path, patient_id: str, visit: str, as_labels: bool = False) -> Volume:
        require_resident(f"volume {self.rel(path)}")  # every call decodes: always the pool, as before
        stored = nib.load(path)
        image = nib.as_closest_canonical(stored)
        data = image.get_fdata()  # float64, decoded afresh on every call
        volume = Volume(data, image.affine, tuple(nib.aff2axcodes(stored.affine)))
        if as_labels:
            volume = Volume(np.rint(data).astype(np.uint8), image.affine, volume.original_axcodes)
            return _as_labels(volume, self.rel(path), patient_id, visit)
        return volume

    def volumetry(self, patient_id: str, visit: str) -> dict[str, OrganMeasure]:
        require_resident(f"volumetry of {patient_id} {visit}")
        vf = self.visit(patient_id, visit)
        labels = self.organ_labels(patient_id, visit)
        water = fat = None
        if "water" in vf.channels and "fat" in vf.channels:
            water, fat = (
                self.image(patient_id, visit, "water").data,
                self.image(patient_id, visit, "fat").data,
            )
        measures = measure(labels.data, labels.voxel_ml, self.label_table, water, fat, 0.0)
        return {m.organ: m for m in measures}


class NaiveImaging(Imaging):
    def __init__(self, store: PatientStore, max_side: int = 448):
        super().__init__(store, max_side)
        self._windows = Memo(0)  # nothing remembered between calls, nor kept on disk
        self._extents = Memo(0)
        self._facts = None

    def window(self, patient_id: str, channel: str) -> Window:
        visits = [v for v in self.store.patient(patient_id).visits if channel in v.channels]
        volumes = [self.store.image(patient_id, v.visit, channel).data.ravel() for v in visits]
        return render.volume_window(volumes)  # every voxel, every call


def create_app() -> FastAPI:
    from case_env.envs.imaging import ImagingEnvironment
    from case_env.server.app import create_app as create_case_app

    render.PNG_LEVEL = PILLOW_DEFAULT_PNG_LEVEL  # this process serves only the naive engine
    return create_case_app(environments=[ImagingEnvironment(NaiveStore, NaiveImaging)])
