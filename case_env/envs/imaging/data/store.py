"""PatientStore: everything the tools read about a patient, decoded once and shared between threads.

Lookups go through the scanned index (`index.py`): a patient id or visit name only ever selects an entry
of a dictionary built from the directory listing, so no path is ever assembled from caller input. Volumes
come from a byte-bounded cache; label maps are checked against their image grid before use. Volumetry is
read from the volumes TSV when the data root has one, and otherwise computed once and cached in the
settings' cache directory, never inside the user's data tree.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from case_env import __version__
from case_env.core.cache import ByteLRU
from case_env.core.resident import NotResidentError, on_loop, require_resident
from case_env.envs.imaging import scan_protocol as protocol
from case_env.envs.imaging.data.decoded import DecodedVolumes
from case_env.envs.imaging.data.errors import (
    DataError,
    MissingDataError,
    UnknownPatientError,
    UnknownVisitError,
)
from case_env.envs.imaging.data.index import DataIndex, PatientFiles, VisitFiles, scan
from case_env.envs.imaging.data.memory import release_freed_memory_promptly
from case_env.envs.imaging.data.nifti import Geometry, NiftiReadError, Volume, load_volume, read_geometry
from case_env.envs.imaging.data.volumetry import OrganMeasure, measure, read_volumes, write_volumes
from case_env.envs.imaging.settings import ImagingSettings
from case_env.envs.imaging.tsv import TsvError

log = logging.getLogger(__name__)

_SMALL_FILES = 16384  # sidecars and reports kept parsed (a few KB each): some 800 patients


@dataclass(frozen=True)
class Report:
    markdown: str | None
    structured: dict | None


def estimate_noise_sigma(volume: Volume) -> float:
    """Rician sigma from the corners of a magnitude image (Rayleigh mean = sigma * sqrt(pi / 2)).

    Returns 0 when the background was masked to zero, as processed data often is.
    """
    d = volume.data
    corners = [
        d[xs, ys, zs]
        for xs in (slice(0, max(1, d.shape[0] // 10)), slice(-max(1, d.shape[0] // 10), None))
        for ys in (slice(0, max(1, d.shape[1] // 10)), slice(-max(1, d.shape[1] // 10), None))
        for zs in (slice(0, max(1, d.shape[2] // 10)), slice(-max(1, d.shape[2] // 10), None))
    ]
    values = np.concatenate([c.ravel() for c in corners]).astype(np.float64)
    if values.size == 0 or np.count_nonzero(values) < 0.5 * values.size:
        return 0.0
    return float(values.mean() * volume.slope / math.sqrt(math.pi / 2))


class PatientStore:
    def __init__(self, root: Path | str | None = None, settings: ImagingSettings | None = None):
        self.settings = settings or ImagingSettings()
        if self.settings.decoded_bytes == 0:
            # each volume is decoded into this process's memory and again after each eviction: keep those
            # buffers off the heap (`bench data`). With the shared decoded files (the default) a volume is a
            # mapped file, the tuning buys nothing, and it cost 3.5 % of a render's server CPU.
            release_freed_memory_promptly()
        if root is not None:
            self.settings = self.settings.model_copy(update={"data_root": Path(root)})
        self.index: DataIndex = scan(self.settings.data_root)
        self.cache: ByteLRU[Volume] = ByteLRU(self.settings.cache_bytes)
        self.decoded = DecodedVolumes(self.settings.cache_dir / "decoded", self.settings.decoded_bytes)
        self._memo_lock = threading.Lock()
        self._geometry: dict[tuple, Geometry] = {}
        self._volumetry: dict[tuple, dict[str, OrganMeasure]] = {}
        self._stats: dict[Path, tuple[float, tuple]] = {}  # path -> (valid until, file key)
        self._fingerprints: dict[str, tuple[float, tuple]] = {}  # patient -> (valid until, fingerprint)
        # small files (sidecars, reports) by their file key: read once, not on every call, so a warm case
        # answers from memory (case_env.core.resident)
        self._small: OrderedDict[tuple, object] = OrderedDict()

    # -- lookup --------------------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.index.root

    @property
    def label_table(self):
        return self.index.label_table

    def patient_ids(self) -> list[str]:
        return list(self.index.patients)

    def patient(self, patient_id: str) -> PatientFiles:
        patient = self.index.patients.get(patient_id)
        if patient is None:
            raise UnknownPatientError(patient_id)
        return patient

    def visit(self, patient_id: str, visit: str) -> VisitFiles:
        patient = self.patient(patient_id)
        found = patient.visit(visit)
        if found is None:
            raise UnknownVisitError(visit, [v.visit for v in patient.visits])
        return found

    def rel(self, path: Path) -> str:
        return self.index.rel(path)

    def fingerprint(self, patient_id: str) -> tuple:
        """(mtime, size) of every file of the patient: changes whenever any of them is replaced, so answers
        derived from the patient's data can be cached under it. Reused for `stat_ttl_s`, like the stats."""
        now = time.monotonic()
        seen = self._fingerprints.get(patient_id)
        if seen is not None and now < seen[0]:
            return seen[1]
        keys = []
        for vf in self.patient(patient_id).visits:
            paths = [
                *vf.channels.values(),
                *(vf.sidecar(c) for c in vf.channels),
                vf.organs,
                vf.lesions,
                vf.lesion_sidecar,
                vf.volumes,
                vf.report_md,
                vf.report_json,
                vf.phantom,
            ]
            for path in paths:
                if path is not None:
                    try:
                        keys.append(self.file_key(path, patient_id, vf.visit)[1:])
                    except DataError:
                        keys.append(None)  # missing now: the tool that needs it says so, uncached
        # one digest, not the keys themselves: the response cache hashes and compares it on every call, and a
        # tuple of some thirty stat keys cost 6 % of a warm call (py-spy profile)
        fingerprint = (hashlib.blake2b(repr(keys).encode(), digest_size=16).digest(),)
        self._fingerprints[patient_id] = (now + self.settings.stat_ttl_s, fingerprint)
        return fingerprint

    # -- volumes -------------------------------------------------------------------------------------------
    def file_key(self, path: Path, patient_id: str, visit: str) -> tuple:
        """(path, mtime, size): cache keys change when a file is replaced. The stat is reused for
        `stat_ttl_s`, because a render touches several files and stat calls were a tenth of server time."""
        now = time.monotonic()
        seen = self._stats.get(path)
        if seen is not None and now < seen[0]:
            return seen[1]
        try:
            st = os.stat(path)
        except OSError as exc:
            self._stats.pop(path, None)
            raise DataError(
                self.rel(path), f"cannot access file ({exc.strerror})", patient_id, visit
            ) from exc
        key = (str(path), st.st_mtime_ns, st.st_size)
        self._stats[path] = (now + self.settings.stat_ttl_s, key)
        return key

    def _load(self, path: Path, patient_id: str, visit: str, as_labels: bool = False) -> Volume:
        key = (*self.file_key(path, patient_id, visit), as_labels)

        def decode() -> Volume:
            try:
                volume = load_volume(path)
            except NiftiReadError as exc:
                raise DataError(self.rel(path), str(exc), patient_id, visit) from exc
            return _as_labels(volume, self.rel(path), patient_id, visit) if as_labels else volume

        if on_loop():  # never decode, nor wait for another thread's decode, on the event loop
            held = self.cache.peek(key)
            if held is None:
                raise NotResidentError(f"volume {self.rel(path)}")
            return held
        return self.cache.get(key, lambda: self.decoded.fetch(key, decode))

    def geometry(self, path: Path, patient_id: str, visit: str) -> Geometry:
        key = self.file_key(path, patient_id, visit)
        with self._memo_lock:
            cached = self._geometry.get(key)
        if cached is None:
            require_resident(f"header of {self.rel(path)}")
            try:
                cached = read_geometry(path)
            except NiftiReadError as exc:
                raise DataError(self.rel(path), str(exc), patient_id, visit) from exc
            with self._memo_lock:
                self._geometry[key] = cached
        return cached

    def image(self, patient_id: str, visit: str, channel: str) -> Volume:
        vf = self.visit(patient_id, visit)
        path = vf.channels.get(channel)
        if path is None:
            raise MissingDataError(
                self.rel(vf.channels.get("water", Path(vf.session))),
                f"channel {channel!r} was not acquired for this visit",
                patient_id,
                visit,
            )
        return self._load(path, patient_id, visit)

    def reference_geometry(self, patient_id: str, visit: str) -> Geometry:
        """The image grid of a visit (first available channel), which label maps must share."""
        vf = self.visit(patient_id, visit)
        for channel in protocol.CHANNELS:
            if channel in vf.channels:
                return self.geometry(vf.channels[channel], patient_id, visit)
        raise MissingDataError(vf.session, "no Dixon image for this visit", patient_id, visit)

    def _checked_labels(self, path: Path | None, what: str, patient_id: str, visit: str) -> Volume:
        if path is None:
            raise MissingDataError("", f"no {what} for {patient_id} {visit}", patient_id, visit)
        labels = self._load(path, patient_id, visit, as_labels=True)
        reference = self.reference_geometry(patient_id, visit)
        grid = Geometry(labels.shape, labels.affine)
        if not grid.matches(reference):
            raise DataError(
                self.rel(path),
                f"label grid {grid.describe()} does not match the image grid {reference.describe()}",
                patient_id,
                visit,
            )
        return labels

    def organ_labels(self, patient_id: str, visit: str) -> Volume:
        return self._checked_labels(
            self.visit(patient_id, visit).organs, "organ label map", patient_id, visit
        )

    def lesion_labels(self, patient_id: str, visit: str) -> Volume | None:
        vf = self.visit(patient_id, visit)
        if vf.lesions is None:
            return None
        return self._checked_labels(vf.lesions, "lesion map", patient_id, visit)

    def preload(self, patient_id: str, threads: int | None = None) -> int:
        """Decode every image channel and organ label map of every visit of a patient, several at a time
        (gzip and the copies release the GIL), so the patient's first render does not wait for them; returns
        the number of volumes. Errors are left for the calls that need the broken file to report."""
        jobs = []
        for vf in self.patient(patient_id).visits:
            jobs += [functools.partial(self.image, patient_id, vf.visit, channel) for channel in vf.channels]
            if vf.organs is not None:
                jobs.append(functools.partial(self.organ_labels, patient_id, vf.visit))

        def run(job) -> bool:
            try:
                job()
                return True
            except DataError:
                return False

        threads = threads or os.cpu_count() or 1
        if threads == 1:  # the server's warming thread: no pool of its own
            return sum(map(run, jobs))
        with ThreadPoolExecutor(threads, thread_name_prefix="case-env-preload") as pool:
            return sum(pool.map(run, jobs))

    # -- small files ---------------------------------------------------------------------------------------
    def _small_file(
        self, path: Path, patient_id: str, visit: str, kind: str, parse: Callable[[Path], object]
    ) -> object:
        """`parse(path)` as `kind`, kept under the file's key (a replaced file is read again); errors are
        not kept."""
        key = (self.file_key(path, patient_id, visit), kind)
        with self._memo_lock:
            if key in self._small:
                self._small.move_to_end(key)
                return self._small[key]
        require_resident(f"file {self.rel(path)}")
        value = parse(path)
        with self._memo_lock:
            self._small[key] = value
            while len(self._small) > _SMALL_FILES:
                self._small.popitem(last=False)
        return value

    def _json(self, path: Path | None, patient_id: str, visit: str) -> dict | None:
        if path is None:
            return None

        def parse(path: Path) -> dict:
            try:
                value = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise DataError(self.rel(path), f"not valid JSON ({exc})", patient_id, visit) from exc
            if not isinstance(value, dict):
                raise DataError(self.rel(path), "expected a JSON object", patient_id, visit)
            return value

        return self._small_file(path, patient_id, visit, "json", parse)  # shared: read it, never change it

    def lesions(self, patient_id: str, visit: str) -> dict[int, dict]:
        """Lesion sidecar by instance id ({} when the visit has no lesion sidecar)."""
        raw = self._json(self.visit(patient_id, visit).lesion_sidecar, patient_id, visit) or {}
        out = {}
        for key, value in raw.items():
            if str(key).isdigit() and isinstance(value, dict):
                out[int(key)] = value
        return out

    def report(self, patient_id: str, visit: str) -> Report | None:
        vf = self.visit(patient_id, visit)
        if vf.report_md is None and vf.report_json is None:
            return None
        markdown = None
        if vf.report_md is not None:

            def parse(path: Path) -> str:
                try:
                    return path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    raise DataError(self.rel(path), f"cannot read report ({exc})", patient_id, visit) from exc

            markdown = self._small_file(vf.report_md, patient_id, visit, "text", parse)
        return Report(markdown, copy.deepcopy(self._json(vf.report_json, patient_id, visit)))

    def manifest(self, patient_id: str, visit: str) -> dict | None:
        """Synthetic ground truth (phantom.json); None for real data. Never served to a model."""
        return copy.deepcopy(self._json(self.visit(patient_id, visit).phantom, patient_id, visit))

    def sidecar(self, patient_id: str, visit: str, channel: str) -> dict:
        """The channel's JSON sidecar, shared between calls: read it, never change it."""
        return self._json(self.visit(patient_id, visit).sidecar(channel), patient_id, visit) or {}

    def stations(self, patient_id: str, visit: str) -> list[tuple[float, float]]:
        """(z_low, z_high) mm of stations 1..6: from the image sidecar, else protocol proportions."""
        for channel in protocol.CHANNELS:
            bounds = self.sidecar(patient_id, visit, channel).get("StationBoundariesMm")
            if (
                isinstance(bounds, list)
                and bounds
                and all(isinstance(b, list) and len(b) == 2 for b in bounds)
            ):
                return [(float(lo), float(hi)) for lo, hi in bounds]
        grid = self.reference_geometry(patient_id, visit)
        z = grid.affine[2, 3] + np.array([0, grid.shape[2] - 1]) * grid.affine[2, 2]
        half = abs(grid.affine[2, 2]) / 2
        return protocol.station_z_ranges(float(z.min()) - half, float(z.max()) + half)

    def noise_sigma(self, patient_id: str, visit: str) -> float:
        sigma = self.sidecar(patient_id, visit, "fat").get("NoiseSigma")
        if isinstance(sigma, int | float) and sigma >= 0:
            return float(sigma)
        vf = self.visit(patient_id, visit)
        return estimate_noise_sigma(self.image(patient_id, visit, "fat")) if "fat" in vf.channels else 0.0

    # -- volumetry -----------------------------------------------------------------------------------------
    def volumetry(self, patient_id: str, visit: str) -> dict[str, OrganMeasure]:
        """Organ measures by organ name."""
        vf = self.visit(patient_id, visit)
        if vf.volumes is not None:
            key = self.file_key(vf.volumes, patient_id, visit)
            with self._memo_lock:
                if key in self._volumetry:
                    return self._volumetry[key]
            require_resident(f"volumes table {self.rel(vf.volumes)}")
            try:
                measures = read_volumes(vf.volumes, self.label_table)
            except (TsvError, ValueError, OSError) as exc:
                raise DataError(
                    self.rel(vf.volumes), f"cannot read volumes table: {exc}", patient_id, visit
                ) from exc
        else:
            key = self._derived_key(vf, patient_id, visit)
            with self._memo_lock:
                if key in self._volumetry:
                    return self._volumetry[key]
            require_resident(f"volumetry of {patient_id} {visit}")
            measures = self._derived_volumetry(key, vf, patient_id, visit)
        by_organ = {m.organ: m for m in measures}
        with self._memo_lock:
            self._volumetry[key] = by_organ
        return by_organ

    def _derived_key(self, vf: VisitFiles, patient_id: str, visit: str) -> tuple:
        if vf.organs is None:
            raise MissingDataError("", f"no organ label map for {patient_id} {visit}", patient_id, visit)
        parts = [self.file_key(vf.organs, patient_id, visit)]
        parts += [
            self.file_key(vf.channels[c], patient_id, visit) for c in ("water", "fat") if c in vf.channels
        ]
        return ("derived", __version__, *parts)

    def _derived_volumetry(
        self, key: tuple, vf: VisitFiles, patient_id: str, visit: str
    ) -> list[OrganMeasure]:
        digest = hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()
        cached = self.settings.cache_dir / "volumetry" / f"{digest}.tsv"
        if cached.is_file():
            try:
                return read_volumes(cached, self.label_table)
            except (TsvError, ValueError, OSError):
                log.warning("ignoring unreadable volumetry cache entry %s", cached)
        labels = self.organ_labels(patient_id, visit)
        water = fat = None
        sigma = 0.0
        if "water" in vf.channels and "fat" in vf.channels:
            water_volume = self.image(patient_id, visit, "water")
            fat_volume = self.image(patient_id, visit, "fat")
            if water_volume.shape == labels.shape and fat_volume.shape == labels.shape:
                water, fat = water_volume.data, fat_volume.data
                sigma = self.noise_sigma(patient_id, visit) / (fat_volume.slope or 1.0)
        measures = measure(labels.data, labels.voxel_ml, self.label_table, water, fat, sigma)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f".{cached.name}.{os.getpid()}.{threading.get_ident()}")
            write_volumes(tmp, measures)
            os.replace(tmp, cached)
        except OSError as exc:
            log.warning("volumetry cache directory not writable (%s); keeping results in memory", exc)
        return measures


def _as_labels(volume: Volume, rel: str, patient_id: str, visit: str) -> Volume:
    """Label maps as uint8: integer-valued maps in other dtypes are converted; anything else is refused."""
    data = volume.data
    if volume.slope != 1.0 or volume.intercept != 0.0:
        data = data * volume.slope + volume.intercept
    if data.dtype == np.uint8:
        return volume
    if data.size and (not np.all(np.isfinite(data)) if data.dtype.kind == "f" else False):
        raise DataError(rel, "label map contains non-finite values", patient_id, visit)
    low, high = (data.min(), data.max()) if data.size else (0, 0)
    if low < 0 or high > 255 or (data.dtype.kind == "f" and not np.array_equal(data, np.round(data))):
        raise DataError(
            rel, f"label map must hold integer labels 0-255 (found values {low}..{high})", patient_id, visit
        )
    converted = np.asfortranarray(data.astype(np.uint8))
    converted.setflags(write=False)
    return Volume(converted, volume.affine, volume.original_axcodes)
