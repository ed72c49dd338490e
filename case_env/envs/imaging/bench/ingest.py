"""`case-env bench ingest`: what converting a UK Biobank download costs, per visit, on this machine.

For each profile: synthetic patients written as field-20201 zips, then, each in a fresh process, (1) the
read floor: every DICOM of a visit's zip parsed and its pixels decoded with pydicom, nothing else; and
(2) `ingest ukb` of the same zips with one worker (read, stitch, reorient, gzip-write four NIfTI). The
ratio of the two says what the stitching and writing add to the reading any converter has to do; peak
RSS (VmHWM of the fresh process) says how much memory one ingest worker needs.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import shutil
import statistics
import time
import zipfile
from pathlib import Path

from case_env.envs.imaging.bench.data import _status_mb
from case_env.envs.imaging.synth.writer import generate_dataset


def _read_floor(zips: list[str]) -> dict:
    import pydicom

    seconds = []
    for path in zips:
        start = time.perf_counter()
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                pydicom.dcmread(io.BytesIO(zf.read(name))).pixel_array  # noqa: B018 - decoding is the cost
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds, "peak_rss_mb": round(_status_mb("VmHWM"), 1)}


def _ingest(zips_dir: str, out: str) -> dict:
    from case_env.envs.imaging.ukb.ingest import ingest

    summary = ingest(Path(zips_dir), Path(out), jobs=1)
    return {
        "seconds": [r.seconds for r in summary.results if r.status == "written"],
        "problems": summary.problems,
        "peak_rss_mb": round(_status_mb("VmHWM"), 1),
    }


def _in_fresh_process(fn, *args) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def run_ingest_bench(out: Path, patients: int, profiles: list[str]) -> dict:
    from case_env.envs.imaging.ukb.synthetic import write_ukb_zips

    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"patients": patients, "profiles": {}}
    for profile in profiles:
        scratch = out / f"scratch-{profile}"
        shutil.rmtree(scratch, ignore_errors=True)
        generate_dataset(scratch / "root", patients, profile, 0, jobs=2)
        start = time.perf_counter()
        zips = write_ukb_zips(scratch / "root", scratch / "zips", 0, lambda _line: None)
        write_s = (time.perf_counter() - start) / len(zips)
        floor = _in_fresh_process(_read_floor, [str(z) for z in zips])
        ingest = _in_fresh_process(_ingest, str(scratch / "zips"), str(scratch / "ingested"))
        floor_s, ingest_s = statistics.median(floor["seconds"]), statistics.median(ingest["seconds"])
        result["profiles"][profile] = {
            "visits": len(zips),
            "zip_mb_per_visit": round(sum(z.stat().st_size for z in zips) / len(zips) / 2**20, 1),
            "synthetic_zip_write_s_per_visit": round(write_s, 2),
            "read_floor_s_per_visit": round(floor_s, 3),
            "ingest_s_per_visit": round(ingest_s, 3),
            "ingest_over_read_floor": round(ingest_s / floor_s, 2),
            "ingest_peak_rss_mb": ingest["peak_rss_mb"],
            "read_floor_peak_rss_mb": floor["peak_rss_mb"],
            "problems": ingest["problems"],
        }
        shutil.rmtree(scratch, ignore_errors=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result
