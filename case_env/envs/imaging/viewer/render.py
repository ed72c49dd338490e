"""Turning a slice of a decoded volume into a PNG a vision-language model can read.

Pure functions, no I/O, shared by the tool handlers and the benchmarks. The pipeline (docs/sources.md,
Rendering): native slice -> volume-level window (shared by both visits) -> uint8 -> bilinear resize to
isotropic millimetres -> 1-pixel label contours drawn after resizing -> PNG, the Up filter on every row,
deflated at level 1 by ISA-L (`isal`; zlib where no wheel exists), a standard zlib stream. The resize is
OpenCV's bit-exact `INTER_LINEAR_EXACT`, the same integers on every CPU, within one grey level of Pillow's
(`tests/test_render_fast_paths.py`). Between resize and encoder an image stays a numpy array (`Raster`);
Pillow still renders each glyph, so letters are the same pixels. What each choice saves is in
docs/performance.md ("Rendering").

Display follows the radiological convention on RAS+ arrays: axial and coronal images put the patient's
right on the viewer's left; sagittal images put anterior on the left; superior or anterior is up.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from dataclasses import dataclass
from enum import StrEnum

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

try:
    from isal import isal_zlib as deflate
except ImportError:  # no wheel for this platform: zlib writes the same format, about 4 times slower
    deflate = zlib

cv2.setNumThreads(0)  # no OpenCV thread pool: the server sizes its own render threads to the cores


class Plane(StrEnum):
    AXIAL = "axial"
    CORONAL = "coronal"
    SAGITTAL = "sagittal"


# Array axis fixed by each plane, and the orientation letters of the displayed image.
AXIS = {Plane.SAGITTAL: 0, Plane.CORONAL: 1, Plane.AXIAL: 2}
ORIENTATION = {  # (left, right, top, bottom) of the image
    Plane.AXIAL: ("R", "L", "A", "P"),
    Plane.CORONAL: ("R", "L", "S", "I"),
    Plane.SAGITTAL: ("A", "P", "S", "I"),
}
ORIENTATION_WORDS = {
    "R": "patient right",
    "L": "patient left",
    "A": "anterior",
    "P": "posterior",
    "S": "superior",
    "I": "inferior",
}
PNG_LEVEL = 1
HEADER_PX = 14
HEADROOM = 0.1


@dataclass(frozen=True)
class Window:
    low: float
    high: float


def take_slice(volume: np.ndarray, plane: Plane, index: int) -> np.ndarray:
    """The slice in display orientation (row 0 at the top)."""
    if plane is Plane.AXIAL:
        s = volume[:, :, index]
    elif plane is Plane.CORONAL:
        s = volume[:, index, :]
    else:
        s = volume[index, :, :]
    return s.T[::-1, ::-1]


def pixel_mm(spacing: tuple[float, float, float], plane: Plane) -> tuple[float, float]:
    """(row height, column width) in mm of the displayed slice."""
    sx, sy, sz = spacing
    return {Plane.AXIAL: (sy, sx), Plane.CORONAL: (sz, sx), Plane.SAGITTAL: (sz, sy)}[plane]


def volume_window(samples: list[np.ndarray], low_pct: float = 0.5, high_pct: float = 99.5) -> Window:
    """Percentile window of the non-zero (body) voxels of one or more volumes, from strided samples."""
    values = np.concatenate([s[s > 0].astype(np.float32) for s in samples]) if samples else np.zeros(0)
    if values.size == 0:
        return Window(0.0, 1.0)
    low, high = np.percentile(values, [low_pct, high_pct])
    high += HEADROOM * (high - low)  # the brightest tissue (liver on water images) must not saturate
    return Window(float(low), float(max(high, low + 1.0)))


def to_uint8(values: np.ndarray, window: Window) -> np.ndarray:
    """Window to 0-255, truncating: (value - low) * 255 / (high - low) in float32, clipped. Integer voxels of
    one or two bytes (MRI is stored as int16 or uint16) go through a table of that formula over every
    possible value, built once per window: one gather instead of five passes over a strided slice, 2 to 2.4
    times faster and the same bytes (`tests/test_render_fast_paths.py`)."""
    if values.dtype.kind in "iu" and values.dtype.itemsize <= 2 and values.dtype.isnative:
        unsigned = values.view(f"u{values.dtype.itemsize}")  # the same bits, so valid table indices
        return np.take(_window_table(window, values.dtype.str), unsigned)
    return _to_uint8_arithmetic(values, window)


@functools.lru_cache(maxsize=64)  # 64 KB a table: at most 4 MB per worker
def _window_table(window: Window, dtype: str) -> np.ndarray:
    """to_uint8 of every value of an integer dtype of one or two bytes, indexed by its unsigned bits."""
    bits = np.dtype(dtype).itemsize * 8
    every = np.arange(2**bits, dtype=f"u{bits // 8}").view(dtype)
    return _to_uint8_arithmetic(every, window)


def _to_uint8_arithmetic(values: np.ndarray, window: Window) -> np.ndarray:
    """to_uint8 by arithmetic. Ufuncs with `out=` rather than `np.clip`, whose Python wrapper cost as much as
    the arithmetic on a slice."""
    out = np.subtract(values, np.float32(window.low), dtype=np.float32)  # reads a strided slice once
    out *= np.float32(255.0 / (window.high - window.low))
    np.maximum(out, 0, out=out)
    np.minimum(out, 255, out=out)
    return out.astype(np.uint8)


def display_size(shape: tuple[int, int], mm: tuple[float, float], longest: int) -> tuple[int, int]:
    """(width, height) in pixels for isotropic millimetres with the longest side `longest`."""
    height_mm, width_mm = shape[0] * mm[0], shape[1] * mm[1]
    scale = longest / max(height_mm, width_mm)
    return max(1, round(width_mm * scale)), max(1, round(height_mm * scale))


def pair_longest(shape: tuple[int, int], mm: tuple[float, float], max_side: int) -> int:
    """Longest side of each half of a side-by-side pair so that the whole panel's longest side is max_side."""
    height_mm, width_mm = shape[0] * mm[0], shape[1] * mm[1]
    if width_mm >= height_mm:
        return max_side // 2
    return min(max_side, int(max_side * height_mm / (2 * width_mm)))


def resize(u8: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear resize of a grey slice to (width, height), a new writable array (see the module docstring)."""
    return cv2.resize(np.ascontiguousarray(u8), size, interpolation=cv2.INTER_LINEAR_EXACT)


def resize_labels(labels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour resize of a label slice to (width, height): OpenCV's `INTER_NEAREST_EXACT`, which
    picks the source pixel Pillow's NEAREST picks (pixel centres, rounding down), 1.6 times faster;
    `tests/test_render_fast_paths.py` checks they agree on every plane."""
    return cv2.resize(np.ascontiguousarray(labels), size, interpolation=cv2.INTER_NEAREST_EXACT)


_CROSS = cv2.getStructuringElement(cv2.MORPH_CROSS, (3, 3))


def contour_mask(labels: np.ndarray) -> np.ndarray:
    """Pixels of a label whose 4-neighbourhood holds another label: where the largest and smallest label of
    the pixel and its four neighbours differ (OpenCV's dilate and erode ignore the outside of the slice)."""
    largest = cv2.dilate(labels, _CROSS)
    smallest = cv2.erode(labels, _CROSS)
    return (largest != smallest) & (labels > 0)


@dataclass(frozen=True)
class Raster:
    """A rendered image as the PNG encoder takes it: grey levels, or palette indices with their palette of
    256 RGB entries. Images stay numpy arrays from the resize to the encoder: each Pillow round trip copied
    the pixels."""

    pixels: np.ndarray
    palette: bytes | None = None

    @property
    def width(self) -> int:
        return self.pixels.shape[1]

    @property
    def height(self) -> int:
        return self.pixels.shape[0]

    def to_pil(self) -> Image.Image:
        image = Image.fromarray(self.pixels, "P" if self.palette else "L")
        if self.palette:
            image.putpalette(self.palette)
        return image


def overlay_contours(
    gray: np.ndarray, labels: np.ndarray, palette: np.ndarray, native: np.ndarray, stamped: np.ndarray
) -> Raster:
    """Each label's outline in its colour over the grey slice, as a palette image: one byte per pixel instead
    of three, so the PNG encoder compresses a third of the data (most of an overlay render's time).

    The palette is the 256 greys with one slot per outline colour taken over (`_free_levels`). `native` is
    the slice before its resize and `stamped` the levels of the pixels the orientation letters took: the
    levels free to take are judged from them, since counting the resized slice took longer than the rest of
    the overlay. Text goes on the grey slice first, since blending palette indices would not blend colours:
    the orientation letters lie under an outline that crosses them."""
    edge = contour_mask(labels)
    where = np.flatnonzero(edge)  # a few thousand pixels: everything below indexes them, not the whole slice
    outlined = labels.ravel()[where]
    present = np.flatnonzero(histogram(outlined))
    if len(present) == 0:
        return Raster(gray)
    freed, index = _free_levels(gray, native, stamped, len(present))
    slot = np.zeros(256, np.uint8)
    slot[present] = freed
    index.ravel()[where] = slot[outlined]
    colours = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
    colours[freed] = palette[present]
    return Raster(index, colours.tobytes())


def _free_levels(
    gray: np.ndarray, native: np.ndarray, stamped: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """`count` grey levels to hand to outline colours, and the slice with the pixels of any freed level
    moved to a kept neighbouring level.

    Levels outside the native slice's range, and not drawn by a letter, are unused: a bilinear resize never
    leaves the range of the pixels it weighs. Those go first, lowest first, and change no pixel; the
    slices of the bench data have 60 of them on average. When they are too few (the slice holds
    near-white voxels), the levels rarest in the native slice follow, each with both neighbours kept, so
    its pixels move by exactly one level. White is never taken: the letters are white."""
    counts = histogram(native)
    span = np.flatnonzero(counts)
    counts += histogram(stamped)
    levels = np.arange(255)
    unused = levels[((levels < span[0]) | (levels > span[-1])) & (counts[:255] == 0)]
    if len(unused) >= count:
        return unused[:count], gray.copy()
    freed = unused.tolist()
    taken = set(freed)
    rarest = np.argsort(counts[:255], kind="stable").tolist()
    # first with both neighbours kept, so each moved pixel moves one level; then, only with more outline
    # colours than half the levels, any of the rest (their pixels take the nearest kept level). The bench
    # data take this path in a third of the overlays (a window's clipping fills the range): stopping once
    # `count` levels are found halved its time
    for spaced in (True, False):
        for level in rarest:
            if len(freed) == count:
                break
            if level not in taken and (not spaced or taken.isdisjoint((level - 1, level + 1))):
                freed.append(level)
                taken.add(level)
    freed_levels = np.array(freed)
    keep = np.ones(256, bool)
    keep[freed_levels] = False
    kept = np.flatnonzero(keep)
    lut = np.arange(256, dtype=np.uint8)
    lut[freed_levels] = kept[np.abs(kept[None, :] - freed_levels[:, None]).argmin(axis=1)]
    return freed_levels, cv2.LUT(gray, lut)


def histogram(u8: np.ndarray) -> np.ndarray:
    """Pixel count of each of the 256 levels of a uint8 array. OpenCV's for a slice: np.bincount first
    widens every pixel to 64 bits, 2 to 3 times slower there (Pillow's needs an image made first); but
    np.bincount for the few thousand outline or letter pixels, where OpenCV's call costs more than counting."""
    if u8.size < _SMALL_HISTOGRAM:
        return np.bincount(u8.ravel(), minlength=256)
    return cv2.calcHist([u8], [0], None, [256], [0, 256]).ravel().astype(np.int64)


_SMALL_HISTOGRAM = 3000  # where the two cost the same here (5.4 against 5.9 us)


def draw_orientation(gray: np.ndarray, plane: Plane) -> np.ndarray:
    """Small orientation letters at the middle of each edge, white on the grey slice; the levels drawn."""
    left, right, top, bottom = ORIENTATION[plane]
    h, w = gray.shape
    placements = (
        (2, h // 2 - 5, left),
        (w - 8, h // 2 - 5, right),
        (w // 2 - 3, 1, top),
        (w // 2 - 3, h - 12, bottom),
    )
    return stamp_texts(gray, placements)


@functools.lru_cache(maxsize=256)
def _text_mask(text: str) -> np.ndarray:
    """Coverage of `text` drawn in white at the origin, rendered by FreeType once per string."""
    font = label_font()
    box = font.getbbox(text)
    mask = Image.new("L", (max(1, box[2]), max(1, box[3])), 0)
    ImageDraw.Draw(mask).text((0, 0), text, fill=255, font=font)
    return np.asarray(mask, dtype=np.uint16)


Placement = tuple[int, int, str]  # (x, y, text): where a text's top-left corner goes


@functools.lru_cache(maxsize=512)
def _stamp_plan(
    shape: tuple[int, int], placements: tuple[Placement, ...]
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Passes that blend `placements` into an image of `shape`: the flat indices of the pixels a text covers
    (coverage m > 0; m = 0 leaves a pixel as it is) and the two factors of Pillow's blend of white through
    m, out = DIV255(in * (255 - m) + 255 * m) with DIV255(t) = (t + 128 + (t + 128 >> 8)) >> 8
    (`tests/test_render_fast_paths.py` checks every pair of in and m). Texts that do not overlap share
    one pass; one that overlaps an earlier text starts the next, as Pillow would draw it over."""
    passes: list[tuple[list, list]] = []
    for x, y, text in placements:
        mask = _text_mask(text)
        rows, cols = np.nonzero(mask)
        inside = (rows + y >= 0) & (rows + y < shape[0]) & (cols + x >= 0) & (cols + x < shape[1])
        rows, cols = rows[inside], cols[inside]  # clipped to the image, as Pillow clips a paste
        index = (rows + y) * shape[1] + cols + x
        if not passes or any(np.intersect1d(index, other).size for other in passes[-1][0]):
            passes.append(([], []))
        passes[-1][0].append(index)
        passes[-1][1].append(mask[rows, cols])
    plan = []
    for indices, coverages in passes:
        coverage = np.concatenate(coverages)
        plan.append((np.concatenate(indices), 255 - coverage, 255 * coverage + 128))  # sum <= 255 * 255 + 128
    return tuple(plan)


def stamp_texts(gray: np.ndarray, placements: tuple[Placement, ...]) -> np.ndarray:
    """White texts drawn in place into a C-contiguous grey image, the very pixels `ImageDraw.text` gives,
    clipped to the image; the levels of the pixels drawn. A cached plan per image size makes it a few
    array operations whatever the number of texts (drawing text by text took a tenth of a render)."""
    if not gray.flags.c_contiguous:
        raise ValueError("stamp_texts draws in place: the image must be C-contiguous")
    flat = gray.reshape(-1)
    drawn = []
    for index, keep, add in _stamp_plan(gray.shape, placements):
        blend = flat[index] * keep
        blend += add
        blend += blend >> 8
        blend >>= 8
        flat[index] = blend
        drawn.append(index)
    return flat[np.concatenate(drawn)] if drawn else flat[:0]


def side_by_side(left: Raster, right: Raster, left_title: str, right_title: str) -> Raster:
    """Two equally sized grey images with a title strip above each and a white line between them."""
    h, w = left.pixels.shape
    panel = np.zeros((h + HEADER_PX, 2 * w), np.uint8)
    panel[HEADER_PX:, :w] = left.pixels
    panel[HEADER_PX:, w:] = right.pixels
    stamp_texts(panel, ((3, 1, left_title), (w + 3, 1, right_title)))
    panel[:, w] = 255
    return Raster(panel)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_UP_FILTER = 2


def _chunk(tag: bytes, data: bytes) -> bytes:
    return b"".join(
        (struct.pack(">I", len(data)), tag, data, struct.pack(">I", zlib.crc32(data, zlib.crc32(tag))))
    )


def encode_png(raster: Raster) -> bytes:
    """8-bit greyscale or palette PNG, every row Up-filtered. Any PNG_LEVEL but 1 (the naive benchmark
    engine sets Pillow's default) goes through Pillow's encoder."""
    if PNG_LEVEL != 1:
        buffer = io.BytesIO()
        raster.to_pil().save(buffer, format="PNG", compress_level=PNG_LEVEL)
        return buffer.getvalue()
    rows = raster.pixels
    height, width = rows.shape
    filtered = np.empty((height, width + 1), np.uint8)
    filtered[:, 0] = _UP_FILTER  # the row above the first is all zeros, so its Up filter is the identity
    filtered[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])  # modulo 256, as PNG defines it
    colour_type = 3 if raster.palette else 0
    header = struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)
    palette = [_chunk(b"PLTE", raster.palette)] if raster.palette else []
    return b"".join(
        (
            _PNG_SIGNATURE,
            _chunk(b"IHDR", header),
            *palette,
            _chunk(b"IDAT", deflate.compress(filtered, PNG_LEVEL)),
            _chunk(b"IEND", b""),
        )
    )


@functools.cache
def label_font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's default font, loaded once: `ImageDraw.text` without a font decodes it anew for every image."""
    return ImageFont.load_default()
