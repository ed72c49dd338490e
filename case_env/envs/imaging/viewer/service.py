"""Rendering with memory: intensity windows, organ extents and slice positions per patient.

A window is computed once per (patient, sequence) from both visits pooled and reused for every image of
that patient, so a liver that gains fat looks brighter on the fat image at follow-up instead of being
normalised away (docs/sources.md, Rendering). Positions are resolved in millimetres, so a comparison shows
the same anatomical level at both visits even when their grids differ.

Windows and the extents of every organ of a label map are derived facts: computed once per dataset, kept on
disk (`data/derived.py`) for every worker and later server start, and held in memory by each worker.
`warm` prepares a patient's in the background, so its first renders can run on the event loop.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from case_env.core.cache import Memo
from case_env.core.resident import require_resident
from case_env.core.tools import ToolImage
from case_env.envs.imaging.data.derived import DerivedFacts
from case_env.envs.imaging.data.errors import DataError
from case_env.envs.imaging.data.nifti import Volume
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.labels import colour_name
from case_env.envs.imaging.viewer import render
from case_env.envs.imaging.viewer.render import AXIS, Plane, Window

_SAMPLE_STRIDE = (
    7  # a strided subsample gives the same percentiles as the whole volume (docs/sources.md, Rendering)
)
# what a stored window depends on besides the volumes: a change to any of them is a new fact
_WINDOW_RULE = (_SAMPLE_STRIDE, 0.5, 99.5, render.HEADROOM)


class OrganNotFoundError(LookupError):
    """The organ has no voxels in the label map of that visit."""


@dataclass(frozen=True)
class SlicePosition:
    plane: Plane
    index: int  # slice index along the plane's axis in that visit's array
    count: int  # slices along that axis
    mm: float  # world coordinate of the slice along the axis
    percent: float
    organ: str | None
    # the visit's volume the position was found in, handed on so that the render does not fetch it again
    volume: Volume = field(compare=False, repr=False)


@dataclass(frozen=True)
class RenderedSlice:
    image: render.Raster
    position: SlicePosition
    window: Window
    pixel_mm: float
    legend: list[tuple[str, str]]  # (organ, colour name) of outlined organs, largest first

    def png(self) -> ToolImage:
        """The image as the tool answers it: a PNG (`render.encode_png`)."""
        return ToolImage(render.encode_png(self.image), self.image.width, self.image.height)


def _world_along(volume: Volume, axis: int, index: float) -> float:
    scale, offset = volume.axes[axis]
    return scale * index + offset


def _index_at(volume: Volume, axis: int, mm: float) -> int:
    scale, offset = volume.axes[axis]
    return round((mm - offset) / scale)


def organ_extents(labels: np.ndarray) -> dict[int, tuple[tuple[int, int], ...]]:
    """Index bounds (first, last) along each axis of every label in a label map, in one pass over its
    labelled voxels: per axis, which (label, index) pairs occur, counted by one `np.bincount`."""
    order = "F" if labels.flags.f_contiguous and not labels.flags.c_contiguous else "C"
    flat = labels.ravel(order=order)  # no copy for a contiguous map
    labelled = np.flatnonzero(flat)
    values = flat[labelled].astype(np.intp)
    present = np.flatnonzero(np.bincount(values, minlength=256))
    bounds: dict[int, list[tuple[int, int]]] = {int(v): [] for v in present}
    for axis, coordinates in enumerate(np.unravel_index(labelled, labels.shape, order=order)):
        size = labels.shape[axis]
        seen = np.bincount(values * size + coordinates, minlength=256 * size).reshape(256, size) > 0
        first, last = seen.argmax(axis=1), size - 1 - seen[:, ::-1].argmax(axis=1)
        for v in present:
            bounds[int(v)].append((int(first[v]), int(last[v])))
    return {v: tuple(b) for v, b in bounds.items()}


class Imaging:
    def __init__(self, store: PatientStore, max_side: int = 448):
        self.store = store
        self.max_side = max_side
        self._windows = Memo(4096)
        self._extents = Memo(4096)  # a visit's extents of every organ each
        self._palette = self._build_palette()
        self._facts: DerivedFacts | None = DerivedFacts(store.settings.cache_dir / "derived")

    def _build_palette(self) -> np.ndarray:
        palette = np.zeros((256, 3), np.uint8)
        for label in self.store.label_table.labels:
            palette[label.index] = [int(label.colour[i : i + 2], 16) for i in (1, 3, 5)]
        return palette

    # -- windows and extents ------------------------------------------------------------------------------
    def window(self, patient_id: str, channel: str) -> Window:
        visits = [v for v in self.store.patient(patient_id).visits if channel in v.channels]
        key = (
            patient_id,
            channel,
            tuple(self.store.file_key(v.channels[channel], patient_id, v.visit) for v in visits),
        )
        cached = self._windows.get(key)
        if cached is None:
            require_resident(
                f"display window of {patient_id} {channel}"
            )  # a file, or a pass over both volumes

            def compute() -> list[float]:
                volumes = [self.store.image(patient_id, v.visit, channel) for v in visits]
                window = render.volume_window([v.data.ravel(order="K")[::_SAMPLE_STRIDE] for v in volumes])
                return [window.low, window.high]

            cached = Window(*self._derived("window", (*key, _WINDOW_RULE), compute))
            self._windows.put(key, cached)
        return cached  # type: ignore[return-value]

    def extent(self, patient_id: str, visit: str, organ: str) -> tuple[tuple[int, int], ...]:
        """Index bounds (first, last) of an organ along each axis."""
        label = self.store.label_table.by_organ.get(organ)
        found = self._organ_extents(patient_id, visit).get(label.index) if label else None
        if found is None:
            raise OrganNotFoundError(organ)
        return found

    def _organ_extents(self, patient_id: str, visit: str) -> dict[int, tuple[tuple[int, int], ...]]:
        """The extents of every organ of a visit's label map, by label."""
        vf = self.store.visit(patient_id, visit)
        key = self.store.file_key(vf.organs, patient_id, visit) if vf.organs else None
        extents = self._extents.get(key)
        if extents is None:
            require_resident(f"organ extents of {patient_id} {visit}")  # a file, or a pass over the label map

            def compute() -> dict[str, list]:
                labels = self.store.organ_labels(patient_id, visit)
                return {str(v): bounds for v, bounds in organ_extents(labels.data).items()}

            stored = self._derived("extents", (key,), compute)
            extents = {int(v): tuple(tuple(b) for b in bounds) for v, bounds in stored.items()}  # type: ignore[union-attr]
            self._extents.put(key, extents)
        return extents  # type: ignore[return-value]

    def _derived(self, kind: str, key: tuple, compute):
        """A derived fact: from disk when a worker or an earlier start stored it, else computed (and kept)."""
        return compute() if self._facts is None else self._facts.fetch(kind, key, compute)

    def warm(self, patient_id: str) -> None:
        """Every window and organ extent of a patient into memory (from disk, or computed and stored), so
        its first renders need no pass over a volume; what cannot be read is left to the calls to report."""
        patient = self.store.patient(patient_id)
        for channel in sorted({c for v in patient.visits for c in v.channels}):
            with contextlib.suppress(DataError):
                self.window(patient_id, channel)
        for vf in patient.visits:
            if vf.organs is not None:
                with contextlib.suppress(DataError):
                    self._organ_extents(patient_id, vf.visit)

    # -- positions ----------------------------------------------------------------------------------------
    def _span(
        self, patient_id: str, visits: list[str], axis: int, organ: str | None, channel: str
    ) -> tuple[float, float, dict[str, Volume]]:
        """World-coordinate span (low, high) along an axis: the organ's extent over the visits, or the scan's."""
        volumes = {v: self.store.image(patient_id, v, channel) for v in visits}
        spans = []
        for v in visits:
            if organ is None:
                first, last = 0, volumes[v].shape[axis] - 1
            else:
                first, last = self.extent(patient_id, v, organ)[axis]
            spans.append(
                sorted((_world_along(volumes[v], axis, first), _world_along(volumes[v], axis, last)))
            )
        return min(s[0] for s in spans), max(s[1] for s in spans), volumes

    def positions(
        self,
        patient_id: str,
        visits: list[str],
        plane: Plane,
        percent: float,
        organ: str | None,
        channel: str,
    ) -> dict[str, SlicePosition]:
        """The same millimetre level in each visit: `percent` of the organ's extent (union over the visits)
        or of the whole volume along the plane's axis."""
        axis = AXIS[plane]
        low, high, volumes = self._span(patient_id, visits, axis, organ, channel)
        mm = low + percent / 100.0 * (high - low)
        out = {}
        for v, volume in volumes.items():
            # min and max, not np.clip, which costs 10 us on a scalar
            index = min(max(_index_at(volume, axis, mm), 0), volume.shape[axis] - 1)
            at = round(_world_along(volume, axis, index), 1)
            out[v] = SlicePosition(plane, index, volume.shape[axis], at, percent, organ, volume)
        return out

    def percent_at(
        self, patient_id: str, visits: list[str], plane: Plane, mm: float, organ: str | None, channel: str
    ) -> float:
        """The `position` argument that cuts through world coordinate `mm` (inverse of `positions`)."""
        low, high, _ = self._span(patient_id, visits, AXIS[plane], organ, channel)
        return min(max(100.0 * (mm - low) / (high - low), 0.0), 100.0) if high > low else 50.0

    # -- rendering ----------------------------------------------------------------------------------------
    def render(
        self,
        patient_id: str,
        visit: str,
        channel: str,
        position: SlicePosition,
        overlay: bool,
        longest: int | None = None,
    ) -> RenderedSlice:
        volume = position.volume
        window = self.window(patient_id, channel)
        raw = render.take_slice(volume.data, position.plane, position.index)
        mm = render.pixel_mm(volume.spacing, position.plane)
        size = render.display_size(raw.shape, mm, longest or self.max_side)
        native = render.to_uint8(raw, window)
        gray = render.resize(native, size)
        stamped = render.draw_orientation(gray, position.plane)  # on the grey slice: see overlay_contours
        image = render.Raster(gray)
        legend: list[tuple[str, str]] = []
        if overlay:
            labels = self.store.organ_labels(patient_id, visit)
            native_labels = render.take_slice(labels.data, position.plane, position.index)
            small = render.resize_labels(native_labels, size)
            image = render.overlay_contours(gray, small, self._palette, native, stamped)
            legend = self._legend(render.histogram(native_labels))
        pixel = max(raw.shape[0] * mm[0], raw.shape[1] * mm[1]) / max(size)
        return RenderedSlice(image, position, window, round(pixel, 2), legend)

    def render_pair(
        self,
        patient_id: str,
        visits: tuple[str, str],
        channel: str,
        positions: dict[str, SlicePosition],
        titles: tuple[str, str],
    ) -> RenderedSlice:
        """Two visits side by side, same window, each half sized so the panel fits the image budget."""
        first = positions[visits[0]]
        volume = first.volume
        shape = render.take_slice(volume.data, first.plane, first.index).shape
        longest = render.pair_longest(shape, render.pixel_mm(volume.spacing, first.plane), self.max_side)
        left = self.render(patient_id, visits[0], channel, first, False, longest)
        right = self.render(patient_id, visits[1], channel, positions[visits[1]], False, longest)
        right_image = right.image
        if right_image.pixels.shape != left.image.pixels.shape:  # grids that differ: Pillow's default resize
            size = (left.image.width, left.image.height)
            right_image = render.Raster(np.array(right_image.to_pil().resize(size)))
        panel = render.side_by_side(left.image, right_image, *titles)
        return RenderedSlice(panel, first, left.window, left.pixel_mm, [])

    def _legend(self, counts: np.ndarray) -> list[tuple[str, str]]:
        """The organs of a label count of the native slice (background never), largest first: by area, which
        the native slice gives exactly; counting the resized one was slower and could swap near-equals."""
        table = self.store.label_table
        order = np.argsort(counts)[::-1]
        present = [int(i) for i in order[(counts[order] > 0) & (order != 0)]]
        return [
            (table.organ(i), colour_name(table.by_index[i].colour if i in table.by_index else "#ffffff"))
            for i in present
        ]
