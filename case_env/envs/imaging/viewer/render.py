"""Turning a slice of a decoded volume into a PNG a vision-language model can read.

Pure functions, no I/O, so the tool handlers and the benchmarks share them. The pipeline follows
docs/sources.md, Rendering: native slice -> volume-level window (shared by both visits) -> uint8
-> bilinear resize to isotropic millimetres -> 1-pixel label contours drawn after resizing -> PNG with
the Up filter on every row, deflated at level 1. Pillow's own encoder spends most of its time choosing a filter
per row; a fixed Up filter done in numpy encodes the same pixels 2 to 2.5 times faster and, on MRI slices,
no larger (`case-env bench server` profiles in the issue 6 closing note). The deflate itself is Intel's
ISA-L (`isal`), about 4 times faster than zlib's level 1 on these rows and a few percent smaller (0.35 vs
1.38 ms and 23.3 vs 24.2 KB per slice of the bench data, `scripts/bench_render.py`); the stream is standard
zlib, so any PNG decoder reads the same pixels. Where no isal wheel exists, zlib does the same job.

The bilinear resize is OpenCV's bit-exact one (`INTER_LINEAR_EXACT`: the same integers on every CPU, so
an image and its digest never depend on the machine), 5 times faster than Pillow's on these slices
(0.17 vs 0.92 ms for 224x174 -> 448x348). Both weigh the same two neighbours with half-pixel centres and
replicate the border; they round differently, so a grey level can differ by one from what Pillow gave
before issue 19, never by more (`tests/test_render_fast_paths.py` checks this on every plane).

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
    scale = np.float32(255.0 / (window.high - window.low))
    out = (values.astype(np.float32) - np.float32(window.low)) * scale
    np.clip(out, 0, 255, out=out)
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


def resize(u8: np.ndarray, size: tuple[int, int]) -> Image.Image:
    """Bilinear resize of a grey slice to (width, height), as a Pillow image (see the module docstring)."""
    return Image.fromarray(cv2.resize(np.ascontiguousarray(u8), size, interpolation=cv2.INTER_LINEAR_EXACT))


def resize_labels(labels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour resize of a label slice to (width, height): OpenCV's `INTER_NEAREST_EXACT`, which
    picks the source pixel Pillow's NEAREST picks (pixel centres, rounding down), 1.6 times faster;
    `tests/test_render_fast_paths.py` checks they agree on every plane."""
    return cv2.resize(np.ascontiguousarray(labels), size, interpolation=cv2.INTER_NEAREST_EXACT)


def contour_mask(labels: np.ndarray) -> np.ndarray:
    """Pixels of a label whose 4-neighbourhood holds another label."""
    edge = np.zeros(labels.shape, bool)
    diff_v = labels[:-1, :] != labels[1:, :]
    diff_h = labels[:, :-1] != labels[:, 1:]
    edge[:-1, :] |= diff_v
    edge[1:, :] |= diff_v
    edge[:, :-1] |= diff_h
    edge[:, 1:] |= diff_h
    return edge & (labels > 0)


def overlay_contours(gray: Image.Image, labels: np.ndarray, palette: np.ndarray) -> Image.Image:
    """Each label's outline in its colour over the slice, as a palette image: one byte per pixel instead of
    three, so the PNG encoder compresses a third of the data (most of an overlay render's time).

    The palette is the 256 greys with one slot per outline colour taken over. The slots freed are grey
    levels the slice does not use, else the rarest ones, whose pixels move one level to a neighbour; white
    is never taken. So outlines are exact and every grey is within one level of the RGB rendering
    (`tests/test_render_fast_paths.py` checks both). Text goes on the grey slice first, since Pillow blends
    palette indices rather than colours: the orientation letters now lie under an outline that crosses
    them, where they used to lie over it."""
    g = np.asarray(gray)
    edge = contour_mask(labels)
    outlined = labels[edge]  # a few thousand pixels: everything below indexes them, not the whole slice
    present = np.flatnonzero(histogram(outlined))
    if len(present) == 0:
        return gray
    counts = histogram(g)
    counts[255] = np.iinfo(counts.dtype).max  # white stays
    freed = np.argsort(counts, kind="stable")[: len(present)]  # unused levels first, then the rarest
    if counts[freed].any():  # a freed level in use: its pixels take the nearest kept level
        kept = np.setdiff1d(np.arange(256), freed)
        lut = np.arange(256, dtype=np.uint8)
        lut[freed] = kept[np.abs(kept[None, :] - freed[:, None]).argmin(axis=1)]
        index = lut[g]
    else:
        index = g.copy()
    slot = np.zeros(256, np.uint8)
    slot[present] = freed
    index[edge] = slot[outlined]
    colours = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
    colours[freed] = palette[present]
    image = Image.fromarray(index, "P")
    image.putpalette(colours.ravel().tobytes())
    return image


def histogram(u8: np.ndarray) -> np.ndarray:
    """Pixel count of each of the 256 levels of a uint8 array (Pillow's C histogram: np.bincount first
    widens every pixel to 64 bits, several times slower on a slice)."""
    if u8.size == 0:
        return np.zeros(256, np.int64)
    flat = np.ascontiguousarray(u8, dtype=np.uint8).reshape(1, -1)
    return np.array(Image.fromarray(flat, "L").histogram(), dtype=np.int64)


def draw_orientation(img: Image.Image, plane: Plane) -> None:
    """Small orientation letters at the middle of each edge."""
    left, right, top, bottom = ORIENTATION[plane]
    w, h = img.size
    stamp_text(img, (2, h // 2 - 5), left)
    stamp_text(img, (w - 8, h // 2 - 5), right)
    stamp_text(img, (w // 2 - 3, 1), top)
    stamp_text(img, (w // 2 - 3, h - 12), bottom)


@functools.lru_cache(maxsize=256)
def _text_mask(text: str) -> Image.Image:
    """Coverage of `text` drawn in white at the origin, rendered by FreeType once per string."""
    font = label_font()
    box = font.getbbox(text)
    mask = Image.new("L", (max(1, box[2]), max(1, box[3])), 0)
    ImageDraw.Draw(mask).text((0, 0), text, fill=255, font=font)
    return mask


def stamp_text(img: Image.Image, xy: tuple[int, int], text: str) -> None:
    """White `text` at `xy`, as `ImageDraw.text` would put it, from a cached glyph mask."""
    mask = _text_mask(text)
    if img.mode == "P":  # Pillow would blend palette indices, not colours
        raise ValueError("stamp text before the palette overlay (draw_orientation on the grey slice)")
    img.paste(
        255 if img.mode == "L" else (255, 255, 255), (*xy, xy[0] + mask.width, xy[1] + mask.height), mask
    )


def side_by_side(left: Image.Image, right: Image.Image, left_title: str, right_title: str) -> Image.Image:
    """Two equally sized images with a title strip above each."""
    mode = "RGB" if "RGB" in (left.mode, right.mode) else "L"
    w, h = left.size
    panel = Image.new(mode, (2 * w, h + HEADER_PX), 0)
    panel.paste(left.convert(mode), (0, HEADER_PX))
    panel.paste(right.convert(mode), (w, HEADER_PX))
    stamp_text(panel, (3, 1), left_title)
    stamp_text(panel, (w + 3, 1), right_title)
    ImageDraw.Draw(panel).line([(w, 0), (w, h + HEADER_PX - 1)], fill=255 if mode == "L" else (255, 255, 255))
    return panel


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_COLOUR_TYPE = {"L": (1, 0), "RGB": (3, 2), "P": (1, 3)}  # mode -> (channels, PNG colour type)
_UP_FILTER = 2


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def encode_png(img: Image.Image) -> bytes:
    """8-bit greyscale, RGB or palette PNG, every row Up-filtered. Other modes, and any PNG_LEVEL but 1 (the
    naive benchmark engine sets Pillow's default), go through Pillow."""
    if img.mode not in _PNG_COLOUR_TYPE or PNG_LEVEL != 1:
        buffer = io.BytesIO()
        img.save(buffer, format="PNG", compress_level=PNG_LEVEL)
        return buffer.getvalue()
    channels, colour_type = _PNG_COLOUR_TYPE[img.mode]
    rows = np.asarray(img).reshape(img.height, img.width * channels)
    filtered = np.empty((img.height, rows.shape[1] + 1), np.uint8)
    filtered[:, 0] = _UP_FILTER  # the row above the first is all zeros, so its Up filter is the identity
    filtered[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])  # modulo 256, as PNG defines it
    header = struct.pack(">IIBBBBB", img.width, img.height, 8, colour_type, 0, 0, 0)
    palette = [_chunk(b"PLTE", bytes(img.getpalette()[:768]))] if img.mode == "P" else []
    return b"".join(
        (
            _PNG_SIGNATURE,
            _chunk(b"IHDR", header),
            *palette,
            _chunk(b"IDAT", deflate.compress(filtered.tobytes(), PNG_LEVEL)),
            _chunk(b"IEND", b""),
        )
    )


@functools.cache
def label_font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's default font, loaded once: `ImageDraw.text` without a font decodes it anew for every image."""
    return ImageFont.load_default()
