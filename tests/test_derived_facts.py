"""Derived facts (`case_env.envs.imaging.data.derived`): display windows and organ extents computed once per
dataset, read back by other workers and later starts, exactly what a pass over the volumes gives."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from case_env.core.resident import NotResidentError, resident_only
from case_env.envs.imaging.data.derived import DerivedFacts
from case_env.envs.imaging.data.store import PatientStore
from case_env.envs.imaging.viewer import render
from case_env.envs.imaging.viewer import service as service_module
from case_env.envs.imaging.viewer.service import Imaging, OrganNotFoundError, organ_extents
from tests.test_data_store import copy_patient


def _extent_by_mask(labels: np.ndarray, value: int) -> tuple[tuple[int, int], ...]:
    """The definition: first and last index along each axis where the label occurs."""
    mask = labels == value
    bounds = []
    for axis in range(3):
        hits = np.flatnonzero(mask.any(axis=tuple(a for a in range(3) if a != axis)))
        bounds.append((int(hits[0]), int(hits[-1])))
    return tuple(bounds)


def test_one_pass_gives_every_organs_extent_as_a_mask_per_organ_does(dataset):
    store = PatientStore(dataset)
    checked = 0
    for patient in store.patient_ids()[:4]:
        for visit in ("baseline", "follow_up"):
            labels = store.organ_labels(patient, visit).data
            extents = organ_extents(labels)
            values = [int(v) for v in np.unique(labels) if v]
            assert sorted(extents) == values
            for value in values:
                assert extents[value] == _extent_by_mask(labels, value)
                checked += 1
            # the same map in the other memory order gives the same extents
            assert organ_extents(np.ascontiguousarray(labels)) == extents
    assert checked > 100


def test_a_second_worker_reads_windows_and_extents_without_a_pass(dataset, monkeypatch):
    first = Imaging(PatientStore(dataset))
    first.warm("case0001")
    window, extent = first.window("case0001", "fat"), first.extent("case0001", "baseline", "liver")
    assert window == render.volume_window(
        [
            first.store.image("case0001", v, "fat").data.ravel(order="K")[::7]
            for v in ("baseline", "follow_up")
        ]
    )

    def no_pass(*args, **kwargs):
        raise AssertionError("a stored fact was computed again")

    monkeypatch.setattr(render, "volume_window", no_pass)
    monkeypatch.setattr(service_module, "organ_extents", no_pass)
    second = Imaging(PatientStore(dataset))  # another worker, or the next server start
    assert second.window("case0001", "fat") == window
    assert second.extent("case0001", "baseline", "liver") == extent
    with pytest.raises(OrganNotFoundError):
        second.extent("case0001", "baseline", "no_such_organ")
    with resident_only():  # held in memory now: answered on the event loop
        assert second.window("case0001", "fat") == window
        with pytest.raises(NotResidentError):  # not yet in this worker's memory: the pool reads the file
            second.window("case0002", "fat")


def test_a_replaced_volume_or_a_damaged_file_gives_the_fact_anew(dataset, tmp_path):
    root = copy_patient(dataset, tmp_path / "root")
    imaging = Imaging(PatientStore(root))
    before = imaging.window("case0001", "water")
    facts = imaging.store.settings.cache_dir / "derived"
    stored = sorted(facts.glob("window-*.json"))
    assert len(stored) == 1
    stored[0].write_text("{not json")  # damaged: computed again, the same window
    assert Imaging(PatientStore(root)).window("case0001", "water") == before
    volume = next((root / "sub-0001").rglob("*rec-water_T1w.nii.gz"))
    os.utime(volume, ns=(1, 1))  # replaced: the source's (mtime, size) is part of the key
    assert Imaging(PatientStore(root)).window("case0001", "water") == before
    assert len(list(facts.glob("window-*.json"))) == 2


def test_facts_are_computed_but_not_kept_where_the_directory_cannot_be_written(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    facts = DerivedFacts(blocker / "derived")
    calls = []
    assert facts.fetch("window", ("k",), lambda: calls.append(1) or [1.0, 2.0]) == [1.0, 2.0]
    assert facts.fetch("window", ("k",), lambda: calls.append(1) or [1.0, 2.0]) == [1.0, 2.0]
    assert len(calls) == 2 and "not usable" in caplog.text


def test_the_directory_keeps_at_most_its_number_of_files_the_newest(tmp_path):
    directory = tmp_path / "derived"
    facts = DerivedFacts(directory)
    for n in range(12):
        facts.fetch("window", (n,), lambda n=n: [float(n), float(n + 1)])
    for age, path in enumerate(sorted(directory.iterdir(), key=lambda p: json.loads(p.read_text()))):
        os.utime(path, (1000 + age, 1000 + age))  # the fact of n = 0 oldest
    DerivedFacts(directory, max_files=5)
    kept = sorted(json.loads(p.read_text())[0] for p in directory.iterdir())
    assert kept == [7.0, 8.0, 9.0, 10.0, 11.0]
