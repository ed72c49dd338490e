"""The speed-ups of issues 6 and 19 change how images are made, never what they show: the Up-filtered PNG
decodes to the exact pixels whichever deflate wrote it, cached glyphs draw the exact text, the OpenCV resize
stays within one grey level of Pillow's, and the naive reference engine answers the same calls as the real
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
from case_env.envs.imaging.store import ImagingStore
from case_env.envs.imaging.viewer import render
from case_env.envs.imaging.viewer.service import Imaging


@pytest.mark.parametrize("deflate", ["isal", "zlib"])
@pytest.mark.parametrize("mode", ["L", "RGB", "P"])
@pytest.mark.parametrize("size", [(1, 1), (3, 7), (448, 202)])
def test_png_decodes_to_the_same_pixels(mode, size, deflate, monkeypatch):
    if deflate == "zlib":  # the fallback where no isal wheel exists
        monkeypatch.setattr(render, "deflate", zlib)
    else:
        assert render.deflate.__name__ == "isal.isal_zlib"  # the default install has ISA-L
    rng = np.random.default_rng(size[0] * 1000 + size[1])
    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    pixels = rng.integers(0, 256, shape, dtype=np.uint8)
    pixels[: size[1] // 2] = 255  # a run of bright rows: Up differences wrap around modulo 256
    image = Image.fromarray(pixels, mode)
    if mode == "P":
        image.putpalette(rng.integers(0, 256, 768, dtype=np.uint8).tobytes())
    data = render.encode_png(image)
    back = Image.open(io.BytesIO(data))
    assert back.mode == mode and back.size == size
    assert np.array_equal(np.asarray(back), pixels)
    if mode == "P":
        assert back.getpalette() == image.getpalette()


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


def test_png_falls_back_to_pillow_for_other_modes():
    image = Image.new("LA", (5, 4), (10, 200))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(render.encode_png(image)))), np.asarray(image))


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_cached_glyphs_draw_exactly_what_pillow_draws(mode):
    for text in ("R", "I", "baseline (2021-03-04)", "follow_up"):
        expected = Image.new(mode, (160, 30), 40)
        ImageDraw.Draw(expected).text(
            (4, 2), text, fill=255 if mode == "L" else (255, 255, 255), font=render.label_font()
        )
        stamped = Image.new(mode, (160, 30), 40)
        render.stamp_text(stamped, (4, 2), text)
        assert np.array_equal(np.asarray(stamped), np.asarray(expected)), text
    edge = Image.new("L", (6, 6), 0)
    render.stamp_text(edge, (3, 3), "W")  # partly outside the image: clipped, not an error
    assert np.asarray(edge).any()


def test_naive_engine_answers_the_same_calls(dataset):
    tools = registry.get("imaging").tools
    fast_store = PatientStore(dataset)
    naive_store = NaiveStore(dataset)
    patient = fast_store.patient_ids()[0]
    fast = ImagingContext(ImagingStore(fast_store, Imaging(fast_store)), patient)
    naive = ImagingContext(ImagingStore(naive_store, NaiveImaging(naive_store)), patient)
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


def _rgb_overlay(gray: Image.Image, labels: np.ndarray, palette: np.ndarray) -> np.ndarray:
    """The RGB rendering the palette overlay replaced (issue 19), as the reference."""
    rgb = np.stack([np.asarray(gray)] * 3, axis=-1)
    edge = render.contour_mask(labels)
    rgb[edge] = palette[labels[edge]]
    return rgb


@pytest.mark.parametrize("levels", [200, 256])
def test_palette_overlay_keeps_outlines_exact_and_greys_within_one_level(levels):
    """With grey levels to spare the palette overlay is pixel-exact; when the slice uses all 256, the
    rarest levels move by one and nothing else changes; white stays white for the orientation letters."""
    rng = np.random.default_rng(levels)
    gray = Image.fromarray(rng.integers(0, levels, (120, 90), dtype=np.uint8), "L")
    labels = np.zeros((120, 90), np.uint8)
    for organ, (top, left) in enumerate([(10, 10), (40, 30), (70, 50), (20, 60)], start=1):
        labels[top : top + 30, left : left + 25] = organ
    palette = np.zeros((256, 3), np.uint8)
    palette[1:5] = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    image = render.overlay_contours(gray, labels, palette)
    assert image.mode == "P"
    decoded = Image.open(io.BytesIO(render.encode_png(image)))
    assert decoded.mode == "P"
    got = np.asarray(decoded.convert("RGB")).astype(int)
    want = _rgb_overlay(gray, labels, palette).astype(int)
    edge = render.contour_mask(labels)
    assert np.array_equal(got[edge], want[edge])  # every outline pixel exactly its organ's colour
    difference = np.abs(got - want).max(axis=-1)
    if levels < 256 - 4:
        assert difference.max() == 0
    else:
        assert difference.max() == 1 and (difference > 0).mean() < 0.03
    with pytest.raises(ValueError, match="before the palette overlay"):
        render.stamp_text(image, (2, 2), "R")  # Pillow would blend palette indices
    assert render.overlay_contours(gray, np.zeros_like(labels), palette) is gray  # nothing to outline


@pytest.mark.parametrize("shape", [(0,), (1, 1), (348, 448), (50, 7)])
def test_histogram_counts_what_bincount_counts(shape):
    pixels = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    view = pixels.T[::-1] if pixels.ndim == 2 else pixels  # a strided view, as slices are
    assert np.array_equal(render.histogram(view), np.bincount(view.ravel(), minlength=256))


def test_label_resize_picks_the_pixels_pillows_nearest_picks_and_the_legend_is_unchanged(dataset):
    """OpenCV's exact nearest-neighbour against Pillow's NEAREST (the label resize before issue 19) on real
    label slices of every plane and on sizes that do not divide evenly; the legend, counted over labelled
    pixels only, against the legend of a whole-slice count."""
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
            small = render.resize_labels(raw, (448, 348))
            counts = render.histogram(small)
            order = np.argsort(counts)[::-1]
            expected = [int(i) for i in order[(counts[order] > 0) & (order != 0)]]
            assert [organ for organ, _ in imaging._legend(small)] == [
                store.label_table.organ(i) for i in expected
            ]
            legends += bool(expected)
    assert legends >= 6  # most slices cut through organs
