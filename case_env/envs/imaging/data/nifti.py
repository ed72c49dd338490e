"""NIfTI in and out: native dtype, RAS+ orientation, spacing from the affine, no float copies.

`get_fdata()` returns float64 (4x an int16 volume) and caches it on the image, so it is never used.
nibabel parses the header; the voxel bytes are then decompressed in chunks straight into the final array
(nibabel's own reader holds a second full-size copy while decoding a `.nii.gz`, doubling the transient
memory of every cache miss). Reorientation is an index flip/transposition (`io_orientation`), which is
what `as_closest_canonical` does, without applying `scl_slope`/`scl_inter` and promoting to float.
Scaling, when present, is carried alongside the array.
"""

from __future__ import annotations

import functools
import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

OBLIQUE_TOLERANCE_DEG = 1.0


class NiftiReadError(Exception):
    """A NIfTI file that cannot be read; the message says why, without a path (callers add theirs)."""


@dataclass(frozen=True)
class Volume:
    """A decoded volume in RAS+ voxel order (Fortran layout, x fastest)."""

    data: np.ndarray
    affine: np.ndarray  # of the reoriented array
    original_axcodes: tuple[str, ...]  # e.g. ("L", "A", "S") as stored on disk
    slope: float = 1.0
    intercept: float = 0.0

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.data.shape[:3]  # type: ignore[return-value]

    @functools.cached_property  # asked on every render; the affine never changes
    def spacing(self) -> tuple[float, float, float]:
        return tuple(float(v) for v in np.linalg.norm(self.affine[:3, :3], axis=0))  # type: ignore[return-value]

    @functools.cached_property
    def axes(self) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
        """(scale, offset) of each voxel axis along its world axis, as Python floats: positions are
        computed on every render, and numpy scalar arithmetic on the affine cost more than they do."""
        return tuple((float(self.affine[a, a]), float(self.affine[a, 3])) for a in range(3))  # type: ignore[return-value]

    @property
    def voxel_ml(self) -> float:
        return abs(float(np.linalg.det(self.affine[:3, :3]))) / 1000.0

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def obliquity_deg(self) -> float:
        """Largest angle between a voxel axis and its nearest world axis."""
        cols = self.affine[:3, :3] / np.linalg.norm(self.affine[:3, :3], axis=0)
        return float(np.degrees(np.arccos(np.clip(np.abs(cols).max(axis=0).min(), -1, 1))))


_CHUNK_BYTES = 1 << 22


def _read_voxels(path: Path, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The voxel block, read in chunks into one preallocated buffer (Fortran order, as NIfTI stores it)."""
    from nibabel.openers import ImageOpener

    n_bytes = int(np.prod(shape)) * dtype.itemsize
    buffer = np.empty(n_bytes, np.uint8)
    view = memoryview(buffer)
    with ImageOpener(str(path), "rb") as f:
        f.seek(offset)
        done = 0
        while done < n_bytes:
            got = f.readinto(view[done : min(done + _CHUNK_BYTES, n_bytes)])
            if not got:
                raise NiftiReadError(f"file ends after {done} of {n_bytes} bytes of voxel data (truncated)")
            done += got
    data = buffer.view(dtype)
    if not dtype.isnative:
        data = data.byteswap().view(dtype.newbyteorder("="))
    return data.reshape(shape, order="F")


def load_volume(path: Path) -> Volume:
    """Decode a whole NIfTI volume into memory, reoriented to RAS+, native dtype."""
    import nibabel as nib  # here: a command that reads no volume skips its 0.15 s import
    from nibabel.filebasedimages import ImageFileError
    from nibabel.orientations import apply_orientation, inv_ornt_aff, io_orientation

    try:
        img = nib.load(str(path))  # parses the header only
        if not isinstance(img, nib.Nifti1Image | nib.Nifti2Image):
            raise NiftiReadError(f"not a NIfTI image ({type(img).__name__})")
        if len(img.shape) < 3 or any(n < 1 for n in img.shape[:3]):
            raise NiftiReadError(f"expected a 3-D volume, got shape {img.shape}")
        header = img.header
        raw = _read_voxels(path, int(img.dataobj.offset), header.get_data_dtype(), img.shape)
        # nibabel moves scl_slope/scl_inter from the header onto the proxy when it loads an image.
        slope, inter = float(img.dataobj.slope), float(img.dataobj.inter)
    except NiftiReadError:
        raise
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise NiftiReadError(f"compressed data is truncated or corrupt ({_pathless(exc, path)})") from exc
    except ImageFileError as exc:
        raise NiftiReadError("not a readable NIfTI file (no valid NIfTI header)") from exc
    except OSError as exc:
        raise NiftiReadError(f"cannot read file ({exc.strerror or _pathless(exc, path)})") from exc
    except ValueError as exc:
        raise NiftiReadError(f"cannot decode image data ({_pathless(exc, path)})") from exc
    if raw.ndim > 3:
        if any(n != 1 for n in raw.shape[3:]):
            raise NiftiReadError(f"expected a 3-D volume, got shape {raw.shape}")
        raw = raw.reshape(raw.shape[:3], order="F")
    ornt = io_orientation(img.affine)
    data = apply_orientation(raw, ornt)
    affine = img.affine @ inv_ornt_aff(ornt, raw.shape)
    if not data.flags.f_contiguous:
        data = np.asfortranarray(data)
    data.setflags(write=False)  # shared between threads through the cache
    return Volume(
        data=data,
        affine=affine,
        original_axcodes=tuple(nib.aff2axcodes(img.affine)),
        slope=1.0 if not np.isfinite(slope) or slope == 0 else float(slope),
        intercept=0.0 if not np.isfinite(inter) else float(inter),
    )


def _pathless(exc: BaseException, path: Path) -> str:
    """An exception's text without the file's location (messages may reach a client)."""
    return str(exc).replace(str(path), path.name).replace(str(path.parent), "")


def save_volume(path: Path, data: np.ndarray, affine: np.ndarray, is_label: bool = False) -> None:
    """Write a volume with explicit units, codes and dtype (nibabel's gzip is deterministic: mtime 0)."""
    import nibabel as nib

    img = nib.Nifti1Image(np.asarray(data), affine)
    header = img.header
    header.set_xyzt_units("mm")
    header.set_data_dtype(np.uint8 if is_label else data.dtype)
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    header["scl_slope"], header["scl_inter"] = 1.0, 0.0
    if is_label:
        header.set_intent("label")
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(img, str(path))


@dataclass(frozen=True)
class Geometry:
    shape: tuple[int, int, int]
    affine: np.ndarray

    def matches(self, other: Geometry, tolerance_mm: float = 1e-3) -> bool:
        if self.shape != other.shape:
            return False
        # the same grid read from two files is usually bit-identical: the exact test is a fifth of allclose's
        return np.array_equal(self.affine, other.affine) or bool(
            np.allclose(self.affine, other.affine, atol=tolerance_mm)
        )

    def describe(self) -> str:
        spacing = np.linalg.norm(self.affine[:3, :3], axis=0)
        return f"{'x'.join(map(str, self.shape))} at {' x '.join(f'{s:.3g}' for s in spacing)} mm"


def read_geometry(path: Path) -> Geometry:
    """Grid of a NIfTI file after RAS+ reorientation, from its header alone (no data decoded)."""
    import nibabel as nib
    from nibabel.filebasedimages import ImageFileError
    from nibabel.orientations import inv_ornt_aff, io_orientation

    try:
        img = nib.load(str(path))
        shape = tuple(int(n) for n in img.shape[:3])
        affine = img.affine
    except ImageFileError as exc:
        raise NiftiReadError("not a readable NIfTI file (no valid NIfTI header)") from exc
    except (OSError, ValueError, EOFError, zlib.error) as exc:
        raise NiftiReadError(f"cannot read NIfTI header ({_pathless(exc, path)})") from exc
    if len(shape) < 3:
        raise NiftiReadError(f"expected a 3-D volume, got shape {img.shape}")
    ornt = io_orientation(affine)
    canonical_shape = tuple(shape[int(axis)] for axis in ornt[:, 0].argsort())
    return Geometry(canonical_shape, affine @ inv_ornt_aff(ornt, shape))  # type: ignore[arg-type]
