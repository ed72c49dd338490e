"""Check 8: data corrupted under a running server (two workers, volumes already decoded, mapped and their
answers cached). Three patients' files are damaged in three ways: an image truncated, an image overwritten
with garbage, a label map replaced by a valid NIfTI on the wrong grid.

Every call for a damaged patient either answers exactly as before (it does not read the damaged file) or
fails with 503 `data_unavailable` and a message that names the problem without a path; every call for every
other patient answers exactly as before; nothing answers 500 or logs a traceback. Once the files are put
back, the damaged patients answer as before again, without a restart.
"""

from __future__ import annotations

import hashlib
import shutil
import time

import httpx
import nibabel as nib
import numpy as np

from case_env.bench.process import ServerProcess
from case_env.envs.imaging.data import layout
from case_env.envs.imaging.data.index import scan

CALLS = [
    ("list_visits", {}),
    ("read_report", {"visit": "follow_up"}),
    ("get_organ_volume", {"organ": "liver", "visit": "baseline"}),
    ("render_slice", {"visit": "baseline", "sequence": "fat", "plane": "axial", "organ": "liver"}),
    ("render_slice", {"visit": "follow_up", "sequence": "water", "plane": "coronal"}),
    ("render_comparison", {"sequence": "fat", "plane": "axial", "organ": "liver"}),
]


def _damage(root) -> dict[str, tuple]:
    """patient -> (damaged file, kind, the call that must now fail)."""
    truncated = root / layout.channel_image("sub-0001", "ses-01", "fat")
    truncated.write_bytes(truncated.read_bytes()[:2000])
    garbage = root / layout.channel_image("sub-0002", "ses-02", "water")
    garbage.write_bytes(np.random.default_rng(0).bytes(garbage.stat().st_size))
    labels = root / layout.organ_labels("sub-0003", "ses-01")
    image = nib.load(labels)
    cropped = np.asanyarray(image.dataobj)[:-4]
    nib.save(nib.Nifti1Image(cropped, image.affine, image.header), labels)
    return {
        "case0001": (truncated, "truncated image", 3),
        "case0002": (garbage, "image overwritten with garbage", 4),
        "case0003": (labels, "label map on the wrong grid", 3),
    }


def _answers(url: str, patients: list[str], rounds: int, tag: str) -> dict[tuple[str, int], list]:
    """(patient, call) -> [(status, code, digest)] over `rounds` fresh connections (both workers)."""
    seen: dict[tuple[str, int], list] = {}
    for r in range(rounds):
        with httpx.Client(base_url=url, timeout=60) as http:
            for patient in patients:
                for i, (tool, arguments) in enumerate(CALLS):
                    body = {
                        "episode_id": f"{tag}-{r}-{patient}",
                        "patient_id": patient,
                        "arguments": arguments,
                    }
                    response = http.post(f"/v1/tools/{tool}", json=body)
                    payload = response.json()
                    content = payload.get("text", "") + "".join(
                        im["data_b64"] for im in payload.get("images", [])
                    )
                    code = (payload.get("error") or {}).get("code")
                    seen.setdefault((patient, i), []).append(
                        (
                            response.status_code,
                            code,
                            hashlib.sha256(content.encode()).hexdigest()[:16],
                            (payload.get("error") or {}).get("message", ""),
                        )
                    )
    return seen


def test_corrupt_data(dataset, tmp_path, figures):
    root = tmp_path / "root"
    shutil.copytree(dataset, root)
    pristine = tmp_path / "pristine"
    shutil.copytree(dataset, pristine)
    patients = scan(root).patient_ids()
    env = {
        "CASE_ENV_DATA_ROOT": str(root),
        "CASE_ENV_CACHE_DIR": str(tmp_path / "cache"),
        "CASE_ENV_WORKERS": "2",
        "CASE_ENV_EPISODE_DB": str(tmp_path / "episodes.sqlite"),
        "CASE_ENV_TOKEN": None,
        "CASE_ENV_AUDIT_LOG": None,
    }
    with ServerProcess(tmp_path / "server.log", env) as server:
        before = _answers(server.url, patients, rounds=2, tag="before")
        damaged = _damage(root)
        time.sleep(1.2)  # the stat TTL: a replaced file is noticed within a second
        during = _answers(server.url, patients, rounds=3, tag="during")
        for path, _, _ in damaged.values():
            shutil.copy2(pristine / path.relative_to(root), path)
        time.sleep(1.2)
        after = _answers(server.url, patients, rounds=2, tag="after")
    log = (tmp_path / "server.log").read_text(errors="replace")

    reference = {key: answers[0] for key, answers in before.items()}
    assert all(status == 200 for answers in before.values() for status, *_ in answers)
    others_changed = damaged_wrong = refused = unclear = 0
    for (patient, i), answers in during.items():
        for status, code, digest, message in answers:
            unchanged = (status, digest) == (200, reference[(patient, i)][2])
            if patient not in damaged:
                others_changed += not unchanged
            elif status == 503 and code == "data_unavailable":
                refused += 1
                unclear += "cannot be read" not in message or "/" in message or ".nii" in message
            else:
                damaged_wrong += not unchanged
    must_fail = sum(all(s == 503 for s, *_ in during[(p, call)]) for p, (_, _, call) in damaged.items())
    recovered = all(
        (s, d) == (200, reference[key][2]) for key, answers in after.items() for s, _, d, _ in answers
    )
    statuses = [s for answers in during.values() for s, *_ in answers]
    figures.update(
        {
            "damaged_patients": {p: kind for p, (_, kind, _) in damaged.items()},
            "calls_during_damage": len(statuses),
            "refused_503_for_damaged_patients": refused,
            "damaged_calls_that_failed_as_required": must_fail,
            "other_patients_calls": sum(len(a) for (p, _), a in during.items() if p not in damaged),
            "other_patients_answers_changed": others_changed,
            "status_500": statuses.count(500),
            "unclear_messages": unclear,
            "recovered_after_repair": recovered,
            "tracebacks_in_log": log.count("Traceback"),
        }
    )
    assert others_changed == 0 and damaged_wrong == 0 and unclear == 0
    assert must_fail == len(damaged) and statuses.count(500) == 0
    assert recovered and "Traceback" not in log
