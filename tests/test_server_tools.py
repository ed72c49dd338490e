"""The seven tools through the real server on loopback: values against ground truth, images by pixels."""

from __future__ import annotations

import base64
import io
import json
import re
import time

import httpx
import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from case_env.envs.imaging.data import layout
from case_env.envs.imaging.tsv import read_tsv
from tests.conftest import manifest, subjects_by_scenario
from tests.server_harness import live_server

KEY_ORGANS = ("liver", "spleen", "pancreas", "left_kidney", "right_kidney", "gallbladder")


@pytest.fixture(scope="module")
def server(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("server")) as live:
        yield live


@pytest.fixture(scope="module")
def call(server):
    client = httpx.Client(base_url=server.url, timeout=60)
    counter = iter(range(10**6))

    def _call(tool: str, patient: str, episode: str | None = None, **arguments) -> dict:
        episode = episode or f"ep-{patient}-{next(counter)}"
        response = client.post(
            f"/v1/tools/{tool}", json={"episode_id": episode, "patient_id": patient, "arguments": arguments}
        )
        assert response.status_code == 200, response.text
        return response.json()

    yield _call
    client.close()


def pid(sub: str) -> str:
    return "case" + sub[4:]


def png(result: dict, index: int = 0) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(result["images"][index]["data_b64"])))


def number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, (pattern, text)
    return float(match.group(1).replace(",", ""))


def test_volumes_match_the_ground_truth(dataset, call):
    for sub in subjects_by_scenario(dataset).values():
        for visit, ses in (("baseline", "ses-01"), ("follow_up", "ses-02")):
            truth = manifest(dataset, sub, ses)["true_volumes_ml"]
            table = {r["name"]: r for r in read_tsv(dataset / layout.organ_volumes(sub, ses))}
            for organ in KEY_ORGANS:
                result = call("get_organ_volume", pid(sub), organ=organ, visit=visit)
                assert result["ok"], result
                value = number(r"volume ([\d,]+\.\d) mL", result["text"])
                assert value == pytest.approx(
                    float(table[organ]["volume_ml"]), abs=0.051
                )  # 1-decimal rounding
                assert value == pytest.approx(truth[organ], rel=0.01), (sub, visit, organ)
            liver = call("get_organ_volume", pid(sub), organ="liver", visit=visit)["text"]
            ff = number(r"signal fat fraction ([\d.]+) %", liver)
            assert ff == pytest.approx(float(table["liver"]["mean_fatfraction_pct"]), abs=0.05)
            heart = call("get_organ_volume", pid(sub), organ="heart", visit=visit)["text"]
            assert "fat fraction" not in heart  # not defined for a blood-filled organ


def test_comparison_gives_sign_and_size_of_change(dataset, call):
    subs = subjects_by_scenario(dataset)
    cases = [
        ("splenomegaly", "spleen", 1),
        ("steatosis_regression", "liver", -1),
        ("pancreatic_fatty_atrophy", "pancreas", -1),
    ]
    for scenario, organ, sign in cases:
        sub = subs[scenario]
        before = float(
            {r["name"]: r for r in read_tsv(dataset / layout.organ_volumes(sub, "ses-01"))}[organ][
                "volume_ml"
            ]
        )
        after = float(
            {r["name"]: r for r in read_tsv(dataset / layout.organ_volumes(sub, "ses-02"))}[organ][
                "volume_ml"
            ]
        )
        text = call("compare_organ_volume", pid(sub), organ=organ)["text"]
        pct = number(r"\(([+-][\d.]+) %\)", text)
        delta = number(r"change ([+-][\d,]+\.\d) mL", text)
        assert np.sign(pct) == sign and np.sign(delta) == sign
        assert pct == pytest.approx(100 * (after / before - 1), abs=0.06)
        assert delta == pytest.approx(after - before, abs=0.06)
        truth = (
            manifest(dataset, sub, "ses-02")["true_volumes_ml"][organ]
            / manifest(dataset, sub, "ses-01")["true_volumes_ml"][organ]
        )
        assert pct == pytest.approx(100 * (truth - 1), abs=1.5)
    steatosis = call("compare_organ_volume", pid(subs["steatosis_progression"]), organ="liver")["text"]
    assert number(r"\(([+-][\d.]+) points\)", steatosis) > 5


def test_visit_dates_and_interval(dataset, call):
    for sub in subjects_by_scenario(dataset).values():
        sessions = read_tsv(dataset / layout.sessions_tsv(sub))
        text = call("list_visits", pid(sub))["text"]
        assert f"baseline ({sessions[0]['acq_time']})" in text
        assert f"follow_up ({sessions[1]['acq_time']})" in text
        assert f"{sessions[1]['interval_days']} days" in text


def test_report_and_context(dataset, call):
    sub = subjects_by_scenario(dataset)["new_liver_lesion"]
    text = call("read_report", pid(sub), visit="follow_up")["text"]
    assert text == (dataset / layout.report(sub, "ses-02", "md")).read_text().strip()
    participants = {r["participant_id"]: r for r in read_tsv(dataset / layout.PARTICIPANTS)}
    row = participants[sub]
    demographics = call("get_clinical_context", pid(sub), section="demographics")["text"]
    assert ("Female" if row["sex"] == "F" else "Male") in demographics
    assert f"{row['age']} years at baseline" in demographics
    for section in ("demographics", "study", "history"):
        text = call("get_clinical_context", pid(sub), section=section)["text"]
        assert row["scenario"] not in text and "lesion" not in text.lower()


def _pixel(index: float, n: int, size: int) -> float:
    """Display pixel of voxel index along an axis that is flipped for display (radiological)."""
    return (n - 1 - index + 0.5) * size / n


def test_comparison_shows_a_new_lesion_in_the_follow_up_half_only(dataset, call):
    sub = subjects_by_scenario(dataset)["new_liver_lesion"]
    lesion = manifest(dataset, sub, "ses-02")["visit_state"]["lesions"][0]
    affine = nib.load(dataset / layout.channel_image(sub, "ses-02", "water")).affine
    shape = nib.load(dataset / layout.channel_image(sub, "ses-02", "water")).shape
    i, j, k = np.linalg.solve(affine[:3, :3], np.array(lesion["centre_mm"]) - affine[:3, 3])
    position = round(k) / (shape[2] - 1) * 100
    result = call("render_comparison", pid(sub), sequence="water", plane="axial", position=position)
    assert result["ok"] and f"slice {round(k) + 1} of {shape[2]}" in result["text"]
    panel = np.asarray(png(result).convert("L")).astype(float)
    header = 14
    half = panel.shape[1] // 2
    left, right = panel[header:, :half], panel[header:, half : 2 * half]
    h, w = left.shape
    cx, cy = _pixel(i, shape[0], w), _pixel(j, shape[1], h)
    radius_px = lesion["diameter_mm"] / 2 / (500.0 / w)
    yy, xx = np.mgrid[:h, :w]
    dist = np.hypot(xx - cx, yy - cy)
    inside = dist <= 0.6 * radius_px
    elsewhere = (dist > 2.5 * radius_px) & (left > 20)
    diff = np.abs(right - left)
    assert inside.sum() >= 4
    assert diff[inside].mean() > 30
    assert diff[inside].mean() > 5 * diff[elsewhere].mean(), (diff[inside].mean(), diff[elsewhere].mean())
    # The lesion is darker than liver on the water image at follow-up.
    assert right[inside].mean() < left[inside].mean() - 30


def test_render_slice_size_aspect_and_orientation(call):
    coronal = call("render_slice", "case0001", visit="baseline", sequence="fat", plane="coronal")
    image = coronal["images"][0]
    assert image["mime"] == "image/png" and image["height"] == 448
    assert image["width"] == pytest.approx(448 * 500.0 / 1110.0, abs=1)
    assert png(coronal).size == (image["width"], image["height"])
    assert "Image left = patient right, top = superior" in coronal["text"] and "y = " in coronal["text"]
    axial = call("render_slice", "case0001", visit="baseline", sequence="water", plane="axial", organ="liver")
    size = png(axial).size
    assert size[0] == 448 and size[1] == pytest.approx(448 * 388.37 / 500.0, abs=1)
    assert "through the liver at 50 % of its extent" in axial["text"] and "z = " in axial["text"]
    sagittal = call(
        "render_slice", "case0001", visit="follow_up", sequence="opp", plane="sagittal", position=50
    )
    assert "Image left = anterior, top = superior" in sagittal["text"] and "x = " in sagittal["text"]
    panel = call("render_comparison", "case0001", sequence="fat", plane="coronal", organ="liver")
    assert max(png(panel).size) <= 448 + 14


def test_overlay_outlines_the_right_organs(dataset, call):
    sub = subjects_by_scenario(dataset)["stable_control"]
    result = call(
        "render_slice",
        pid(sub),
        visit="follow_up",
        sequence="water",
        plane="axial",
        organ="liver",
        position=60,
        overlay=True,
    )
    assert "liver orange" in result["text"] and "spleen sky blue" in result["text"]
    rgb = np.asarray(png(result).convert("RGB"))
    k = int(number(r"slice (\d+) of", result["text"])) - 1
    labels = np.asanyarray(nib.load(dataset / layout.organ_labels(sub, "ses-02")).dataobj)[:, :, k].T[
        ::-1, ::-1
    ]
    shown = np.asarray(Image.fromarray(np.ascontiguousarray(labels)).resize(rgb.shape[1::-1], Image.NEAREST))
    for label, colour in ((1, (255, 140, 0)), (3, (0, 200, 255))):
        drawn = np.all(rgb == colour, axis=-1)
        assert drawn.sum() > 20
        assert (shown[drawn] == label).mean() > 0.95
    without = np.asarray(
        png(
            call(
                "render_slice",
                pid(sub),
                visit="follow_up",
                sequence="water",
                plane="axial",
                organ="liver",
                position=60,
            )
        ).convert("RGB")
    )
    assert not np.all(without == (255, 140, 0), axis=-1).any()


def test_one_window_per_sequence_for_both_visits(dataset, call):
    sub = subjects_by_scenario(dataset)["steatosis_progression"]
    window = r"window (\d+)-(\d+)"
    base = call("render_slice", pid(sub), visit="baseline", sequence="fat", plane="axial", organ="liver")
    follow = call("render_slice", pid(sub), visit="follow_up", sequence="fat", plane="axial", organ="liver")
    assert re.search(window, base["text"]).groups() == re.search(window, follow["text"]).groups()
    # So the liver is brighter on the follow-up fat image: the fat is visible, not normalised away.
    assert np.asarray(png(follow).convert("L")).mean() > np.asarray(png(base).convert("L")).mean()


def test_concurrent_first_touch_loads_each_volume_once(dataset, tmp_path):
    import concurrent.futures

    sub = subjects_by_scenario(dataset)["sarcopenia"]

    def one(n: int) -> int:
        body = {
            "episode_id": f"burst-{n}",
            "patient_id": pid(sub),
            "arguments": {"visit": "baseline", "sequence": "in", "plane": "axial", "position": 40},
        }
        return httpx.post(f"{server.url}/v1/tools/render_slice", json=body, timeout=60).status_code

    with live_server(dataset, tmp_path, warm_patients=False, response_cache_mb=0) as server:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            assert list(pool.map(one, range(16))) == [200] * 16
        # One decode of the in-phase volume of each visit (the window pools both), nothing more.
        assert server.state.cases["imaging"].patients.cache.stats().loads == 2


def test_a_new_patient_is_warmed_in_the_background(dataset, tmp_path):
    sub = subjects_by_scenario(dataset)["stable_control"]
    with live_server(dataset, tmp_path) as server:
        store = server.state.cases["imaging"].patients
        assert store.cache.stats().loads == 0
        body = {"episode_id": "warm", "patient_id": pid(sub), "arguments": {}}
        assert httpx.post(f"{server.url}/v1/tools/list_visits", json=body, timeout=60).json()["ok"]
        visits = store.patient(pid(sub)).visits
        volumes = sum(len(v.channels) + (v.organs is not None) for v in visits)
        deadline = time.monotonic() + 60
        while store.cache.stats().loads < volumes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.cache.stats().loads == volumes  # every channel and label map of both visits, once each
        body["arguments"] = {"visit": "follow_up", "sequence": "opp", "plane": "coronal", "overlay": True}
        assert httpx.post(f"{server.url}/v1/tools/render_slice", json=body, timeout=60).json()["ok"]
        assert store.cache.stats().loads == volumes  # the render found everything decoded


def test_responses_never_carry_paths(dataset, call):
    for tool, args in [
        ("list_visits", {}),
        ("read_report", {"visit": "baseline"}),
        ("render_slice", {"visit": "baseline", "sequence": "water", "plane": "axial"}),
    ]:
        text = json.dumps(call(tool, "case0002", **args))
        assert str(dataset) not in text and "/sub-" not in text
