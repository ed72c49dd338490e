"""Calls of a warm case answered on the event loop, calls that need I/O in the pool: where each call runs,
that both places give the same bytes, and that the store refuses I/O on the loop (case_env.core.resident)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import httpx
import pytest

from case_env.core import registry
from case_env.core.resident import NotResidentError, resident_only
from case_env.core.tools import ToolSpec
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.settings import ImagingSettings
from case_env.server.settings import ServerSettings
from tests.server_harness import live_server, with_tools
from tests.test_data_store import copy_patient

RENDER = {"visit": "baseline", "sequence": "water", "plane": "coronal", "position": 40, "overlay": True}
VOLUME = {"organ": "liver", "visit": "follow_up"}


def _watched(spec: ToolSpec, seen: list[tuple[str, str]], **changes) -> ToolSpec:
    """The real tool, noting the thread of every run (the loop's attempt and the pool's)."""

    def run(ctx, args):
        seen.append((spec.name, threading.current_thread().name))
        return spec.run(ctx, args)

    return dataclasses.replace(spec, run=run, **changes)


def _environment(seen: list, **changes) -> list:
    tools = registry.get("imaging").tools
    watched = {name: _watched(spec, seen, **changes) for name, spec in tools.items()}
    return [with_tools("imaging", watched)]


def _call(url: str, tool: str, arguments: dict, episode: str = "resident") -> dict:
    body = {"episode_id": episode, "patient_id": "case0001", "arguments": arguments}
    response = httpx.post(f"{url}/v1/tools/{tool}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["ok"] is True, response.text
    return response.json()


def _places(seen: list, tool: str) -> list[str]:
    return ["pool" if name.startswith("case-env-") else "loop" for t, name in seen if t == tool]


def _answer(body: dict) -> tuple:
    return body["text"], [image["data_b64"] for image in body["images"]]


def test_a_cold_case_goes_to_the_pool_and_a_warm_one_stays_on_the_loop_with_the_same_bytes(dataset, tmp_path):
    seen: list = []
    settings = {"response_cache_mb": 0, "warm_patients": False, "render_threads": 1}
    with live_server(dataset, tmp_path, environments=_environment(seen), **settings) as live:
        assert live.state.settings.renders_on_loop  # one render thread: nothing to gain from the hand-off
        cold = _call(live.url, "render_slice", RENDER)
        assert _places(seen, "render_slice") == ["loop", "pool"]  # the loop refused at the first read
        warm = _call(live.url, "render_slice", RENDER)
        assert _places(seen, "render_slice") == ["loop", "pool", "loop"]
        assert _answer(warm) == _answer(cold)  # same PNG bytes from either place
        first = _call(live.url, "get_organ_volume", VOLUME)
        second = _call(live.url, "get_organ_volume", VOLUME)
        assert _places(seen, "get_organ_volume")[-1] == "loop"
        assert first["text"] == second["text"]
        _call(live.url, "read_report", {"visit": "baseline"})  # the report file: read once, in the pool
        _call(live.url, "read_report", {"visit": "baseline"})
        assert _places(seen, "read_report") == ["loop", "pool", "loop"]


def test_renders_stay_in_the_pool_when_a_worker_has_render_threads_to_spare(dataset, tmp_path):
    seen: list = []
    settings = {"response_cache_mb": 0, "render_threads": 2}
    with live_server(dataset, tmp_path, environments=_environment(seen), **settings) as live:
        assert not live.state.settings.renders_on_loop
        for _ in range(2):
            _call(live.url, "render_slice", RENDER)
            _call(live.url, "get_organ_volume", VOLUME)
        assert _places(seen, "render_slice") == ["pool", "pool"]
        assert _places(seen, "get_organ_volume")[-1] == "loop"  # text tools still skip the hand-off


def test_a_tool_that_does_not_declare_resident_never_runs_on_the_loop(dataset, tmp_path):
    seen: list = []
    environment = _environment(seen, resident=False)
    with live_server(
        dataset, tmp_path, environments=environment, response_cache_mb=0, render_threads=1
    ) as live:
        for _ in range(3):
            _call(live.url, "get_organ_volume", VOLUME)
            _call(live.url, "render_slice", RENDER)
        assert set(_places(seen, "get_organ_volume")) == set(_places(seen, "render_slice")) == {"pool"}


@pytest.mark.parametrize(
    ("threads", "chosen", "on_loop"),
    [(1, None, True), (2, None, False), (2, True, True), (1, False, False)],
)
def test_renders_go_on_the_loop_with_one_render_thread_unless_set(threads, chosen, on_loop, monkeypatch):
    monkeypatch.delenv("CASE_ENV_LOOP_RENDERS", raising=False)
    assert ServerSettings(render_threads=threads, loop_renders=chosen).renders_on_loop is on_loop


def test_the_store_refuses_io_on_the_loop_and_answers_from_memory_once_read(dataset, tmp_path):
    root = copy_patient(dataset, tmp_path / "root")
    store = PatientStore(settings=ImagingSettings(data_root=root, cache_dir=tmp_path / "cache", stat_ttl_s=0))
    patient = store.patient_ids()[0]
    with resident_only(), pytest.raises(NotResidentError, match="volume"):
        store.image(patient, "baseline", "water")
    with resident_only(), pytest.raises(NotResidentError, match="file"):
        store.sidecar(patient, "baseline", "water")
    volume = store.image(patient, "baseline", "water")
    sidecar = store.sidecar(patient, "baseline", "water")
    with resident_only():
        assert store.image(patient, "baseline", "water") is volume
        assert store.sidecar(patient, "baseline", "water") == sidecar
    # a replaced sidecar is read again (its key is its stat), and refused on the loop until then
    path = store.visit(patient, "baseline").sidecar("water")
    path.write_text(path.read_text().rstrip() + "\n\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    with resident_only(), pytest.raises(NotResidentError):
        store.sidecar(patient, "baseline", "water")
    assert store.sidecar(patient, "baseline", "water") == sidecar
