"""Field-20201 zips: writing them from stations (the synthetic downloads) and reading them back.

Reading follows what the public loaders rely on (`protocol`): every file of the zip is a DICOM slice;
slices group into series by SeriesInstanceUID; the channel comes from SeriesDescription; the stations of a
channel are numbered in acquisition order (AcquisitionTime, then SeriesNumber). Everything that is wrong
with a zip is a `ZipError` naming the zip, the member and what is wrong.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from case_env.envs.imaging.ukb import protocol
from case_env.envs.imaging.ukb.stations import Station

MR_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.4"
NUMERIC_TAGS = {
    "MagneticFieldStrength",
    "RepetitionTime",
    "EchoTime",
    "FlipAngle",
    "SliceThickness",
    "SeriesNumber",
}
FACT_TAGS = (
    "Manufacturer",
    "ManufacturerModelName",
    "MagneticFieldStrength",
    "RepetitionTime",
    "EchoTime",
    "FlipAngle",
    "SliceThickness",
)


class ZipError(ValueError):
    """A visit's zip that cannot be ingested; other visits are unaffected."""


@dataclass
class Visit:
    """The 24 series of one zip: per channel, the stations in acquisition order."""

    channels: dict[str, list[Station]]
    study_date: date | None
    patient: dict[str, str]  # PatientID, PatientSex, PatientAge as written


def require_pydicom():
    try:
        import pydicom
    except ImportError as exc:  # the `ukb` extra
        raise ZipError("reading UK Biobank DICOM needs pydicom: pip install 'case-env[ukb]'") from exc
    return pydicom


# -- writing (the synthetic downloads) --------------------------------------------------------------------
def _ds_number(value: float) -> str:
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text if len(text) <= 16 else f"{value:.8g}"


def write_zip(
    path: Path,
    channels: dict[str, list[Station]],
    eid: str,
    study_date: date,
    sex: str,
    age: int,
    seed: int,
) -> int:
    """One visit as a UK Biobank field-20201 zip: 24 series of axial slices, uncompressed little-endian
    MR images; returns the number of files."""
    pydicom = require_pydicom()
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    def uid(*key: object) -> str:
        """A 2.25 (UUID-derived) UID from the key: the same patient always gives the same zip."""
        return generate_uid(None, entropy_srcs=[str(seed), eid, str(study_date), *map(str, key)])

    study = uid("study")
    files = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".zip.partial")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for c_index, (channel, stations) in enumerate(channels.items()):
            for number, station in enumerate(stations, start=1):
                series = uid("series", channel, number)
                series_number = 1 + (number - 1) * len(channels) + c_index
                acquired = f"09{5 * number:02d}00.000000"  # stations in acquisition order
                for k in range(station.data.shape[2]):
                    meta = FileMetaDataset()
                    meta.MediaStorageSOPClassUID = MR_IMAGE_STORAGE
                    meta.MediaStorageSOPInstanceUID = uid("sop", channel, number, k)
                    meta.TransferSyntaxUID = ExplicitVRLittleEndian
                    ds = Dataset()
                    ds.file_meta = meta
                    ds.SOPClassUID = MR_IMAGE_STORAGE
                    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
                    ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
                    ds.Modality = "MR"
                    ds.Manufacturer = "case-env synthetic"
                    ds.MagneticFieldStrength = "1.5"
                    ds.PatientID = eid
                    ds.PatientSex = sex
                    ds.PatientAge = f"{age:03d}Y"
                    ds.StudyDate = ds.SeriesDate = ds.AcquisitionDate = study_date.strftime("%Y%m%d")
                    ds.SeriesTime = ds.AcquisitionTime = acquired
                    ds.SeriesDescription = protocol.series_description(number, channel)
                    ds.SeriesNumber = series_number
                    ds.InstanceNumber = k + 1
                    ds.ImageOrientationPatient = [_ds_number(x) for x in (*station.row_dir, *station.col_dir)]
                    ds.ImagePositionPatient = [_ds_number(x) for x in station.positions[k]]
                    ds.SliceLocation = _ds_number(float(station.positions[k] @ station.normal))
                    ds.PixelSpacing = [_ds_number(station.spacing[1]), _ds_number(station.spacing[0])]
                    ds.SliceThickness = ds.SpacingBetweenSlices = _ds_number(station.step())
                    pixels = np.ascontiguousarray(station.data[:, :, k].T)  # (rows, columns)
                    ds.Rows, ds.Columns = pixels.shape
                    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
                    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 16, 15
                    ds.PixelRepresentation = 1 if np.issubdtype(pixels.dtype, np.signedinteger) else 0
                    ds.PixelData = pixels.astype("<i2" if ds.PixelRepresentation else "<u2").tobytes()
                    buffer = io.BytesIO()
                    pydicom.dcmwrite(buffer, ds, enforce_file_format=True)
                    zf.writestr(f"{series}.{k + 1}.dcm", buffer.getvalue())
                    files += 1
    tmp.replace(path)
    return files


# -- reading ------------------------------------------------------------------------------------------------
def _floats(value, n: int, what: str, where: str) -> np.ndarray:
    try:
        out = np.array([float(x) for x in value], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ZipError(f"{where}: {what} is not {n} numbers") from exc
    if out.shape != (n,):
        raise ZipError(f"{where}: {what} has {out.size} values, expected {n}")
    return out


def _read_dicom(pydicom, invalid: type[Exception], raw: bytes):
    """A DICOM file, also one written without the 128-byte preamble (as some exporters do), but only if
    it then reads as an image: `force` alone would accept any bytes."""
    try:
        return pydicom.dcmread(io.BytesIO(raw))
    except invalid as exc:
        try:
            ds = pydicom.dcmread(io.BytesIO(raw), force=True)
        except Exception:  # a forced parse of arbitrary bytes fails in many ways; the first error says it
            raise exc from None
        if "PixelData" not in ds or "SOPClassUID" not in ds:
            raise exc from None
        return ds


def read_zip(path: Path) -> Visit:
    """The 24 series of a field-20201 zip; raises ZipError naming what is wrong."""
    pydicom = require_pydicom()
    from pydicom.errors import InvalidDicomError

    name = path.name
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ZipError(f"{name}: not a readable zip file (truncated or not a zip: {exc})") from exc
    series: dict[str, list] = {}
    with archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
        for member in members:
            where = f"{name}:{member.filename}"
            try:
                raw = archive.read(member)
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
                raise ZipError(f"{where}: cannot be read from the zip (truncated or corrupt: {exc})") from exc
            if member.filename.lower().startswith("manifest") and not raw.startswith(b"\0" * 128):
                continue  # the download's file list, not an image
            try:
                ds = _read_dicom(pydicom, InvalidDicomError, raw)
            except (InvalidDicomError, EOFError, ValueError, TypeError, KeyError) as exc:
                reason = str(exc).split(". Use force=True")[0]  # pydicom's advice is not the user's
                raise ZipError(f"{where}: not a DICOM file ({reason})") from exc
            description = str(ds.get("SeriesDescription", ""))
            if protocol.channel_of(description) is None:
                raise ZipError(
                    f"{where}: SeriesDescription {description!r} is not a Dixon series; field 20201 holds "
                    "Dixon_*_in, _opp, _F and _W series (is this another field's zip?)"
                )
            series.setdefault(str(ds.get("SeriesInstanceUID", description)), []).append((where, ds))
    if len(series) != protocol.SERIES:
        counts = {}
        for slices in series.values():
            channel = protocol.channel_of(str(slices[0][1].SeriesDescription))
            counts[channel] = counts.get(channel, 0) + 1
        detail = ", ".join(
            f"{protocol.SUFFIX_OF_CHANNEL[c]} {counts.get(c, 0)}" for c in protocol.SUFFIX_OF_CHANNEL
        )
        raise ZipError(
            f"{name}: {len(series)} series, expected {protocol.SERIES} (6 stations x 4 channels); "
            f"stations per channel: {detail}"
        )
    channels: dict[str, list[tuple[tuple, Station]]] = {}
    first = next(iter(series.values()))[0][1]
    for slices in series.values():
        station = _station(slices)
        ds = slices[0][1]
        key = (str(ds.get("AcquisitionTime", "")), int(ds.get("SeriesNumber", 0) or 0))
        channels.setdefault(protocol.channel_of(str(ds.SeriesDescription)), []).append((key, station))
    for channel in protocol.SUFFIX_OF_CHANNEL:
        if len(channels.get(channel, [])) != protocol.STATIONS:
            raise ZipError(
                f"{name}: channel {protocol.SUFFIX_OF_CHANNEL[channel]} has {len(channels.get(channel, []))} "
                f"stations, expected {protocol.STATIONS}"
            )
    ordered = {}
    for channel in protocol.SUFFIX_OF_CHANNEL:
        stations = [s for _, s in sorted(channels[channel], key=lambda item: item[0])]
        for number, s in enumerate(stations, start=1):
            s.label = (
                f"{name} station {number} ({s.facts['SeriesDescription']}, series {s.facts['SeriesNumber']})"
            )
        ordered[channel] = stations
    study = str(first.get("StudyDate", ""))
    try:
        study_date = date(int(study[:4]), int(study[4:6]), int(study[6:8])) if len(study) >= 8 else None
    except ValueError:
        study_date = None
    patient = {k: str(first.get(k, "")) for k in ("PatientID", "PatientSex", "PatientAge")}
    return Visit(ordered, study_date, patient)


UNCOMPRESSED = {"1.2.840.10008.1.2", "1.2.840.10008.1.2.1"}  # implicit and explicit VR little endian


def _pixels(ds) -> np.ndarray:
    """Uncompressed 16-bit monochrome slices (what UK Biobank's Dixon series hold) straight from the
    bytes, three times faster than pydicom's general decoder; anything else through pydicom."""
    syntax = str(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", ""))
    if syntax in UNCOMPRESSED and ds.get("BitsAllocated") == 16 and ds.get("SamplesPerPixel", 1) == 1:
        rows, columns = int(ds.Rows), int(ds.Columns)
        dtype = "<i2" if ds.get("PixelRepresentation", 0) else "<u2"
        raw = ds.PixelData
        if len(raw) >= rows * columns * 2:
            return np.frombuffer(raw, dtype=dtype, count=rows * columns).reshape(rows, columns)
    return ds.pixel_array


def _station(slices: list) -> Station:
    where, ds = slices[0]
    iop = _floats(ds.get("ImageOrientationPatient"), 6, "ImageOrientationPatient", where)
    spacing = _floats(ds.get("PixelSpacing"), 2, "PixelSpacing", where)
    row_dir, col_dir = iop[:3], iop[3:]
    normal = np.cross(row_dir, col_dir)
    entries = []
    for w, s in slices:
        position = _floats(s.get("ImagePositionPatient"), 3, "ImagePositionPatient", w)
        entries.append((float(position @ normal), position, w, s))
    entries.sort(key=lambda e: e[0])
    arrays = []
    for _, _, w, s in entries:
        try:
            arrays.append(_pixels(s))
        except Exception as exc:  # pydicom raises many types for undecodable pixel data
            raise ZipError(f"{w}: pixel data cannot be decoded ({exc})") from exc
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise ZipError(f"{where}: slices of one series have different sizes {sorted(shapes)}")
    data = np.stack([a.T for a in arrays], axis=2)  # (columns, rows, slices)
    facts = {}
    for key in (*FACT_TAGS, "SeriesDescription", "SeriesNumber", "SeriesInstanceUID"):
        value = ds.get(key)
        if value is None or str(value) == "":
            continue
        facts[key] = _number(value) if key in NUMERIC_TAGS else str(value)
    return Station(
        data,
        row_dir,
        col_dir,
        (float(spacing[1]), float(spacing[0])),
        np.stack([e[1] for e in entries]),
        where,
        facts,
    )


def _number(value) -> float | int | str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return int(number) if number.is_integer() else number
