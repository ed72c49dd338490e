"""Dixon water / fat / in-phase / opposed-phase images from a tissue map.

Only this module uses numpy's `Generator`: visceral-fat pattern, texture, bias field, station gain steps
and Rician noise are realism, not ground truth, so they may differ between numpy builds (docs/sources.md,
section 6, "Determinism"). Parameters (texture +-3 %, second-order bias field, 3x3-ish in-plane blur,
Rician sigma 15, zeroed background) follow the phantom notes in docs/sources.md, Phantom;
the bias field is shared by both visits of a subject so that it does not masquerade as change.
"""

from __future__ import annotations

import numpy as np

from case_env.envs.imaging.scan_protocol import CHANNELS
from case_env.envs.imaging.synth.geometry import FOV_MM, Grid, station_z_ranges
from case_env.envs.imaging.synth.plan import VisitState
from case_env.envs.imaging.synth.raster import block_mean
from case_env.envs.imaging.synth.tissues import TISSUE_INDEX, TISSUE_NAMES, TISSUES

NOISE_SIGMA = 15.0
_TEXTURE_MM = 13.0  # correlation length of texture and visceral-fat pattern


def _tables(state: VisitState) -> tuple[np.ndarray, np.ndarray]:
    ff_override = {"liver": state.liver_ff, "pancreas": state.pancreas_ff, "muscle": state.muscle_ff}
    s = np.array([TISSUES[n][0] for n in TISSUE_NAMES], np.float32)
    ff = np.array([ff_override.get(n, TISSUES[n][1]) for n in TISSUE_NAMES], np.float32)
    return s * (1 - ff), s * ff


def _interpolation_matrix(n_out: int, n_in: int) -> np.ndarray:
    src = np.linspace(0, n_in - 1, n_out)
    i0 = np.minimum(np.floor(src).astype(np.intp), n_in - 2)
    w = src - i0
    m = np.zeros((n_out, n_in), np.float32)
    m[np.arange(n_out), i0] = 1 - w
    m[np.arange(n_out), i0 + 1] = w
    return m


def _upsample_linear(coarse: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Separable linear interpolation of a coarse grid spanning the field of view onto `shape`."""
    out = coarse
    for ax, n in enumerate(shape):
        out = np.moveaxis(np.tensordot(_interpolation_matrix(n, out.shape[ax]), out, axes=(1, ax)), 0, ax)
    return np.asfortranarray(out, dtype=np.float32)


def _smooth_field(rng: np.random.Generator, shape: tuple[int, int, int], sd: float) -> np.ndarray:
    coarse_shape = tuple(max(2, round(f / _TEXTURE_MM)) + 1 for f in FOV_MM)
    return _upsample_linear(rng.normal(0.0, sd, coarse_shape).astype(np.float32), shape)


def mix_visceral_fat(
    tissue: np.ndarray, factor: int, vat_frac: float, subject_rng: np.random.Generator
) -> None:
    """Turn a `vat_frac` share of the free abdominal cavity into fat, in a smooth, subject-fixed pattern."""
    cavity = tissue == TISSUE_INDEX["bowel"]
    if not cavity.any():
        return
    field = _smooth_field(subject_rng, tuple(n // factor for n in tissue.shape), 1.0)  # type: ignore[arg-type]
    for ax in range(3):  # the pattern is smooth: nearest-neighbour onto the finer grid is enough
        field = np.repeat(field, factor, axis=ax)
    threshold = np.quantile(field[cavity][::7], vat_frac)
    tissue[cavity & (field < threshold)] = TISSUE_INDEX["adipose"]


def _blur_inplane(a: np.ndarray) -> np.ndarray:
    """Separable [1, 2, 1] / 4 blur in x and y (edges replicated): the scanner's in-plane point spread."""
    for ax in (0, 1):
        head = [slice(None)] * 3
        tail = [slice(None)] * 3
        head[ax], tail[ax] = slice(1, None), slice(None, -1)
        out = a * np.float32(0.5)
        out[tuple(head)] += a[tuple(tail)] * np.float32(0.25)
        out[tuple(tail)] += a[tuple(head)] * np.float32(0.25)
        first, last = [slice(None)] * 3, [slice(None)] * 3
        first[ax], last[ax] = slice(0, 1), slice(-1, None)
        out[tuple(first)] += a[tuple(first)] * np.float32(0.25)
        out[tuple(last)] += a[tuple(last)] * np.float32(0.25)
        a = out
    return a


def _gain_field(
    shape: tuple[int, int, int], subject_rng: np.random.Generator, visit_rng: np.random.Generator
) -> np.ndarray:
    """Texture (+-3 %) times a second-order polynomial bias field, built coarse and upsampled once.

    The bias coefficients are mostly the subject's (shared by both visits) with a small per-visit part.
    """
    coarse_shape = tuple(max(2, round(f / _TEXTURE_MM)) + 1 for f in FOV_MM)
    texture = 1.0 + visit_rng.normal(0.0, 0.03, coarse_shape)
    coeff = subject_rng.uniform(-0.08, 0.08, 9) + visit_rng.uniform(-0.02, 0.02, 9)
    u, v, w = (np.linspace(-1, 1, n) for n in coarse_shape)
    u, v, w = u[:, None, None], v[None, :, None], w[None, None, :]
    log_gain = (
        coeff[0] * u
        + coeff[1] * v
        + coeff[2] * w
        + coeff[3] * u * u
        + coeff[4] * v * v
        + coeff[5] * w * w
        + coeff[6] * u * v
        + coeff[7] * u * w
        + coeff[8] * v * w
    )
    return _upsample_linear((texture * np.exp(log_gain)).astype(np.float32), shape)


def _lookup(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """table[index] keeping the Fortran layout (mixed layouts make every later operation strided)."""
    return table[index.ravel(order="F")].reshape(index.shape, order="F")


def _station_slices(grid: Grid) -> list[slice]:
    z = grid.axis(2)
    return [slice(int(np.searchsorted(z, lo)), int(np.searchsorted(z, hi))) for lo, hi in station_z_ranges()]


def _body_mask(tissue_fine: np.ndarray, factor: int) -> np.ndarray:
    body = block_mean((tissue_fine != TISSUE_INDEX["air"]).astype(np.float32), factor) > 0
    for _ in range(2):  # dilate in-plane so the noise floor around the skin survives
        grown = body.copy()
        grown[1:] |= body[:-1]
        grown[:-1] |= body[1:]
        grown[:, 1:] |= body[:, :-1]
        grown[:, :-1] |= body[:, 1:]
        body = grown
    return body


def dixon_images(
    tissue_fine: np.ndarray,
    factor: int,
    grid: Grid,
    state: VisitState,
    subject_rng: np.random.Generator,
    visit_rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """int16 images on `grid` from a tissue map sampled `factor` times finer on each axis."""
    w_tab, f_tab = _tables(state)
    water = block_mean(_lookup(w_tab, tissue_fine), factor)
    fat = block_mean(_lookup(f_tab, tissue_fine), factor)
    body = _body_mask(tissue_fine, factor)

    gain = _gain_field(grid.shape, subject_rng, visit_rng)
    for sl, step in zip(_station_slices(grid), visit_rng.uniform(0.97, 1.03, 6), strict=True):
        gain[:, :, sl] *= np.float32(step)
    water = _blur_inplane(water * gain)
    fat = _blur_inplane(fat * gain)
    del gain

    clean = {"water": water, "fat": fat, "in": water + fat, "opp": np.abs(water - fat)}
    inside = np.flatnonzero(body.ravel(order="F"))  # the background stays exactly zero (smaller files)
    out = {}
    for name in CHANNELS:
        # Rician magnitude: |signal + complex Gaussian noise|.
        real = visit_rng.standard_normal(inside.size, dtype=np.float32)
        real *= NOISE_SIGMA
        real += clean.pop(name).ravel(order="F")[inside]
        imag = visit_rng.standard_normal(inside.size, dtype=np.float32)
        imag *= NOISE_SIGMA
        magnitude = np.hypot(real, imag, out=real)
        np.minimum(magnitude, 32767, out=magnitude)
        flat = np.zeros(body.size, np.int16)
        flat[inside] = np.rint(magnitude, out=magnitude)
        out[name] = flat.reshape(body.shape, order="F")
    if state.fat_water_swap_station:
        sl = _station_slices(grid)[state.fat_water_swap_station - 1]
        swapped = out["water"][:, :, sl].copy()
        out["water"][:, :, sl] = out["fat"][:, :, sl]
        out["fat"][:, :, sl] = swapped
    return out
