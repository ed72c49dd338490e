"""The speed-ups of issues 6 and 19 change how images are made, not what they show: the Up-filtered PNG
decodes to the exact pixels whichever deflate wrote it, the letters stamped with numpy are the pixels
Pillow draws, the OpenCV resize stays within one grey level of Pillow's, the palette overlay keeps outlines
exact and every grey within one level, and the naive reference engine answers the same calls as the real
one."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image, ImageDraw

from case_env.core import registry
from case_env.envs.imaging.bench.naive import NaiveImaging, NaiveStore
from case_env.envs.imaging.context import ImagingContext
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.store import ImagingCases
from case_env.envs.imaging.viewer import render
from case_env.envs.imaging.viewer.service import Imaging


# level 6, Pillow's default, is the naive engine's and goes through Pillow's encoder
@pytest.mark.parametrize("level", [1, 6])
@pytest.mark.parametrize("deflate", ["isal", "zlib"])
@pytest.mark.parametrize("mode", ["L", "P"])
@pytest.mark.parametrize("size", [(1, 1), (3, 7), (448, 202)])
def test_png_decodes_to_the_same_pixels(mode, size, deflate, level, monkeypatch):
    if deflate == "zlib":  # the fallback where no isal wheel exists
        monkeypatch.setattr(render, "deflate", zlib)
    else:
        assert render.deflate.__name__ == "isal.isal_zlib"  # the default install has ISA-L
    monkeypatch.setattr(render, "PNG_LEVEL", level)
    rng = np.random.default_rng(size[0] * 1000 + size[1])
    pixels = rng.integers(0, 256, (size[1], size[0]), dtype=np.uint8)
    pixels[: size[1] // 2] = 255  # a run of bright rows: Up differences wrap around modulo 256
    palette = rng.integers(0, 256, 768, dtype=np.uint8).tobytes() if mode == "P" else None
    back = Image.open(io.BytesIO(render.encode_png(render.Raster(pixels, palette))))
    assert back.mode == mode and back.size == size
    assert np.array_equal(np.asarray(back), pixels)
    if mode == "P":
        assert bytes(back.getpalette()) == palette


def test_resize_is_within_one_grey_level_of_pillows_bilinear(dataset):
    """OpenCV's bit-exact bilinear against Pillow's, which rendered every image before issue 19, on real
    slices of every plane: the same size, no pixel more than one level apart, most of them equal."""
    store = PatientStore(dataset)
    patient = store.patient_ids()[0]
    volume = store.image(patient, "baseline", "water")
    window = render.volume_window([volume.data.ravel()[::7]])
    differing = []
    for plane in render.Plane:
        count = volume.shape[render.AXIS[plane]]
        for index in (0, count // 3, count // 2, count - 1):
            raw = render.take_slice(volume.data, plane, index)
            size = render.display_size(raw.shape, render.pixel_mm(volume.spacing, plane), 448)
            u8 = render.to_uint8(raw, window)
            pillow = np.asarray(Image.fromarray(np.ascontiguousarray(u8)).resize(size, Image.BILINEAR))
            ours = np.asarray(render.resize(u8, size))
            assert ours.shape == pillow.shape == (size[1], size[0])
            difference = np.abs(ours.astype(int) - pillow.astype(int))
            assert difference.max() <= 1, (plane, index)
            differing.append((difference > 0).mean())
    assert np.mean(differing) < 0.2


def test_the_blend_is_pillows_for_every_grey_and_coverage():
    """The stamped letters blend white through a glyph's coverage with Pillow's integer formula: every
    background level against every coverage value, the 65,536 cases, against Pillow's own paste."""
    coverage = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 256, axis=1)
    background = np.repeat(np.arange(256, dtype=np.uint8)[None, :], 256, axis=0)
    expected = Image.fromarray(background.copy(), "L")
    expected.paste(255, (0, 0, 256, 256), Image.fromarray(coverage, "L"))
    keep, add = 255 - coverage.astype(np.uint16), 255 * coverage.astype(np.uint16) + 128
    blend = background * keep + add
    assert np.array_equal(((blend + (blend >> 8)) >> 8).astype(np.uint8), np.asarray(expected))


def test_stamped_texts_are_exactly_what_pillow_draws():
    def pillow(placements, shape=(30, 160)):
        image = Image.new("L", shape[::-1], 40)
        for x, y, text in placements:
            ImageDraw.Draw(image).text((x, y), text, fill=255, font=render.label_font())
        return np.asarray(image)

    cases = [
        ((4, 2, "R"),),
        ((4, 2, "baseline (2021-03-04)"), (90, 2, "follow_up")),
        ((4, 2, "overlapping"), (12, 5, "texts")),  # the second blends over the first, as Pillow draws it
        ((150, 20, "W"), (-3, -4, "A")),  # partly outside: clipped, not an error
        ((500, 500, "I"),),  # wholly outside: nothing drawn
    ]
    for placements in cases:
        stamped = np.full((30, 160), 40, np.uint8)
        drawn = render.stamp_texts(stamped, placements)
        expected = pillow(placements)
        assert np.array_equal(stamped, expected), placements
        changed = stamped[expected != 40]
        assert set(np.unique(changed)) <= set(np.unique(drawn))  # the levels reported include every change
    assert render.stamp_texts(np.zeros((30, 160), np.uint8), cases[-1]).size == 0
    with pytest.raises(ValueError, match="C-contiguous"):
        render.stamp_texts(np.zeros((30, 160), np.uint8).T, ((2, 2, "R"),))


def test_naive_engine_answers_the_same_calls(dataset):
    tools = registry.get("imaging").tools
    fast_store = PatientStore(dataset)
    naive_store = NaiveStore(dataset)
    patient = fast_store.patient_ids()[0]
    fast = ImagingContext(ImagingCases(fast_store, Imaging(fast_store)), patient)
    naive = ImagingContext(ImagingCases(naive_store, NaiveImaging(naive_store)), patient)
    for name, arguments in [
        ("list_visits", {}),
        ("read_report", {"visit": "baseline"}),
        ("get_organ_volume", {"organ": "liver", "visit": "follow_up"}),
    ]:
        spec = tools[name]
        args = spec.parse(arguments)
        fast_text, naive_text = spec.run(fast, args).text, spec.run(naive, args).text
        if name == "get_organ_volume":  # the volume in mL is a voxel count either way
            assert fast_text.split(" mL")[0] == naive_text.split(" mL")[0]
        else:
            assert fast_text == naive_text
    spec = tools["render_slice"]
    args = spec.parse({"visit": "baseline", "sequence": "water", "plane": "axial", "organ": "liver"})
    fast_image = Image.open(io.BytesIO(spec.run(fast, args).images[0].png))
    naive_image = Image.open(io.BytesIO(spec.run(naive, args).images[0].png))
    assert fast_image.size == naive_image.size
    # windows differ slightly (all voxels against a strided sample): the same anatomy, nearly the same grey
    difference = np.abs(np.asarray(fast_image, float) - np.asarray(naive_image, float))
    assert difference.mean() < 4


def _rgb_overlay(gray: np.ndarray, labels: np.ndarray, palette: np.ndarray) -> np.ndarray:
    """The RGB rendering the palette overlay replaced (issue 19), as the reference."""
    rgb = np.stack([gray] * 3, axis=-1)
    edge = render.contour_mask(labels)
    rgb[edge] = palette[labels[edge]]
    return rgb


def _decoded_rgb(raster: render.Raster) -> np.ndarray:
    decoded = Image.open(io.BytesIO(render.encode_png(raster)))
    assert decoded.mode == "P"
    return np.asarray(decoded.convert("RGB")).astype(int)


def _boxes(shape: tuple[int, int], count: int) -> np.ndarray:
    labels = np.zeros(shape, np.uint8)
    for organ in range(1, count + 1):
        top, left = (organ * 7) % (shape[0] - 12), (organ * 11) % (shape[1] - 10)
        labels[top : top + 12, left : left + 10] = organ
    return labels


@pytest.mark.parametrize("levels", [200, 256])
def test_palette_overlay_keeps_outlines_exact_and_greys_within_one_level(levels):
    """With grey levels to spare the palette overlay is pixel-exact; when the slice uses all 256, rare
    levels move by one and nothing else changes; white is never taken."""
    rng = np.random.default_rng(levels)
    gray = rng.integers(0, levels, (120, 90), dtype=np.uint8)
    labels = np.zeros((120, 90), np.uint8)
    for organ, (top, left) in enumerate([(10, 10), (40, 30), (70, 50), (20, 60)], start=1):
        labels[top : top + 30, left : left + 25] = organ
    palette = np.zeros((256, 3), np.uint8)
    palette[1:5] = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    got = _decoded_rgb(render.overlay_contours(gray, labels, palette, gray, gray[:0]))
    want = _rgb_overlay(gray, labels, palette).astype(int)
    edge = render.contour_mask(labels)
    assert np.array_equal(got[edge], want[edge])  # every outline pixel exactly its organ's colour
    difference = np.abs(got - want).max(axis=-1)
    if levels < 256 - 4:
        assert difference.max() == 0
    else:
        assert difference.max() == 1 and (difference > 0).mean() < 0.03
        assert got[(gray == 255) & ~edge].min() == 255  # white stays white for the letters
    assert render.overlay_contours(gray, np.zeros_like(labels), palette, gray, gray[:0]).pixels is gray


def test_rare_neighbouring_levels_move_one_level_at_most():
    """The case the count-based choice before this change got wrong: every level in use, the rarest ones
    side by side near white (as where the letters' edges lie). Each freed level keeps both neighbours,
    so no pixel moves by more than one level (it moved by up to 16 on the bench data)."""
    rng = np.random.default_rng(7)
    gray = rng.integers(0, 230, (200, 160), dtype=np.uint8)
    gray.ravel()[:26] = np.arange(230, 256)  # levels 230..255 once each: the 25 rarest, all neighbours
    labels = _boxes(gray.shape, 20)
    palette = np.zeros((256, 3), np.uint8)
    palette[1:21] = rng.integers(0, 256, (20, 3), dtype=np.uint8)
    got = _decoded_rgb(render.overlay_contours(gray, labels, palette, gray, gray[:0]))
    want = _rgb_overlay(gray, labels, palette).astype(int)
    edge = render.contour_mask(labels)
    assert np.array_equal(got[edge], want[edge])
    assert np.abs(got - want).max(axis=-1)[~edge].max() == 1


def test_overlays_of_real_renders_against_the_rgb_rendering(dataset):
    """On real slices of every plane: a level outside the native slice's range and not drawn by a letter
    never occurs in the resized image (what lets the overlay skip counting it), outlines are exact, every
    other pixel is within one level of the grey render, and a slice with enough such levels is exact."""
    store = PatientStore(dataset)
    imaging = Imaging(store)
    patient = store.patient_ids()[0]
    volume = store.image(patient, "baseline", "fat")
    labels = store.organ_labels(patient, "baseline").data
    window = imaging.window(patient, "fat")
    exact = 0
    for plane in render.Plane:
        count = volume.shape[render.AXIS[plane]]
        for index in (count // 4, count // 2, 3 * count // 4):
            native = render.to_uint8(render.take_slice(volume.data, plane, index), window)
            for longest in (448, 201, 90):
                size = render.display_size(native.shape, render.pixel_mm(volume.spacing, plane), longest)
                gray = render.resize(native, size)
                drawn = render.draw_orientation(gray, plane)
                outside = np.ones(256, bool)
                outside[native.min() : native.max() + 1] = False
                outside[np.unique(drawn)] = False
                assert not render.histogram(gray)[outside].any(), (plane, index, longest)
                small = render.resize_labels(render.take_slice(labels, plane, index), size)
                palette = imaging._palette
                overlay = render.overlay_contours(gray, small, palette, native, drawn)
                if overlay.palette is None:
                    continue
                got, want = _decoded_rgb(overlay), _rgb_overlay(gray, small, palette).astype(int)
                edge = render.contour_mask(small)
                assert np.array_equal(got[edge], want[edge])
                difference = np.abs(got - want).max(axis=-1)
                assert difference.max() <= 1
                exact += difference.max() == 0
    assert exact >= 3


def test_contours_are_the_pixels_with_a_different_neighbour():
    """The OpenCV contour (dilate against erode) against the definition, written out with numpy shifts."""
    rng = np.random.default_rng(3)
    for shape in ((1, 1), (2, 5), (60, 45)):
        labels = rng.integers(0, 4, shape, dtype=np.uint8)
        different = np.zeros(shape, bool)
        vertical, horizontal = labels[:-1] != labels[1:], labels[:, :-1] != labels[:, 1:]
        different[:-1] |= vertical
        different[1:] |= vertical
        different[:, :-1] |= horizontal
        different[:, 1:] |= horizontal
        assert np.array_equal(render.contour_mask(labels), different & (labels > 0)), shape


@pytest.mark.parametrize("dtype", ["int16", "uint16", "int8", "uint8", ">i2"])
@pytest.mark.parametrize("window", [(0.0, 1.0), (3.2, 700.7), (-150.5, 40.25), (-40000.0, 70000.0)])
def test_window_table_gives_the_arithmetics_bytes_for_every_value(dtype, window):
    """to_uint8 (a per-window table for one- and two-byte integers in native order, arithmetic otherwise)
    against the float32 formula written out here, as it stood before the table: every value of the dtype,
    in a contiguous array and in a flipped, transposed slice of a Fortran-ordered volume as take_slice
    gives, and the same values as float32."""
    win = render.Window(*window)

    def formula(values: np.ndarray) -> np.ndarray:
        scaled = (values.astype(np.float32) - np.float32(win.low)) * np.float32(255.0 / (win.high - win.low))
        return np.clip(scaled, 0, 255).astype(np.uint8)

    info = np.iinfo(np.dtype(dtype))
    every = np.arange(info.min, info.max + 1).astype(dtype)
    assert np.array_equal(render.to_uint8(every, win), formula(every))
    volume = np.asfortranarray(np.random.default_rng(1).choice(every, (37, 29, 23)))
    for plane in render.Plane:
        raw = render.take_slice(volume, plane, 11)
        fast = render.to_uint8(raw, win)
        assert fast.dtype == np.uint8 and fast.flags.c_contiguous
        assert np.array_equal(fast, formula(raw)), plane
    floats = every.astype(np.float32)
    assert np.array_equal(render.to_uint8(floats, win), formula(floats))


@pytest.mark.parametrize("shape", [(0,), (1, 1), (348, 448), (50, 7)])
def test_histogram_counts_what_bincount_counts(shape):
    pixels = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    view = pixels.T[::-1] if pixels.ndim == 2 else pixels  # a strided view, as slices are
    assert np.array_equal(render.histogram(view), np.bincount(view.ravel(), minlength=256))


def test_label_resize_picks_the_pixels_pillows_nearest_picks_and_the_legend_is_by_area(dataset):
    """OpenCV's exact nearest-neighbour against Pillow's NEAREST (the label resize before issue 19) on real
    label slices of every plane and on sizes that do not divide evenly; the legend lists every organ of
    the native slice, largest area first."""
    store = PatientStore(dataset)
    imaging = Imaging(store)
    patient = store.patient_ids()[0]
    labels = store.organ_labels(patient, "baseline").data
    legends = 0
    for plane in render.Plane:
        count = labels.shape[render.AXIS[plane]]
        for index in (0, count // 3, count // 2, count - 1):
            raw = np.ascontiguousarray(render.take_slice(labels, plane, index))
            for size in ((448, 348), (181, 448), (97, 61), (raw.shape[1] * 3 + 1, raw.shape[0] * 2 - 1)):
                pillow = np.asarray(Image.fromarray(raw).resize(size, Image.NEAREST))
                ours = render.resize_labels(raw, size)
                assert np.array_equal(ours, pillow), (plane, index, size)
            legend = [organ for organ, _ in imaging._legend(render.histogram(raw))]
            areas = [int((raw == store.label_table.by_organ[organ].index).sum()) for organ in legend]
            assert set(legend) == {store.label_table.organ(int(i)) for i in np.unique(raw) if i}
            assert areas == sorted(areas, reverse=True) and min(areas, default=1) > 0  # largest first
            legends += bool(legend)
    assert legends >= 6  # most slices cut through organs
