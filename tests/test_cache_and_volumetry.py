"""The byte-bounded cache and the volumetry arithmetic, on small arrays with known answers."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

from case_env.core.cache import ByteLRU
from case_env.envs.imaging.data.volumetry import (
    fat_fractions,
    interior,
    label_counts,
    measure,
    read_volumes,
    write_volumes,
)
from case_env.envs.imaging.labels import LabelTable


@dataclass
class Blob:
    nbytes: int
    name: str = ""


def test_lru_evicts_least_recently_used_by_bytes():
    cache: ByteLRU[Blob] = ByteLRU(100)
    for key in "abc":
        cache.get(key, lambda k=key: Blob(40, k))
    stats = cache.stats()
    assert stats.items == 2 and stats.bytes == 80 and stats.evictions == 1
    cache.get("b", lambda: Blob(40, "reloaded"))  # hit: b becomes most recent
    cache.get("d", lambda: Blob(40, "d"))  # evicts c, the least recent
    assert cache.get("b", lambda: Blob(40, "x")).name == "b"
    assert cache.get("c", lambda: Blob(40, "c2")).name == "c2"


def test_an_item_larger_than_the_budget_is_served_not_kept():
    cache: ByteLRU[Blob] = ByteLRU(100)
    cache.get("small", lambda: Blob(50))
    assert cache.get("huge", lambda: Blob(500)).nbytes == 500
    stats = cache.stats()
    assert stats.items == 1 and stats.bytes == 50


def test_concurrent_requests_load_once():
    cache: ByteLRU[Blob] = ByteLRU(1000)
    calls = []

    def slow_load():
        calls.append(1)
        time.sleep(0.2)
        return Blob(10, "v")

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", slow_load))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 16 and all(r is results[0] for r in results)


def test_a_failed_load_reaches_every_waiter_and_is_retried():
    cache: ByteLRU[Blob] = ByteLRU(1000)
    errors = []

    def failing():
        time.sleep(0.1)
        raise OSError("disk gone")

    def call():
        try:
            cache.get("k", failing)
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 4
    assert cache.get("k", lambda: Blob(1, "ok")).name == "ok"


def test_label_counts_match_a_direct_count():
    rng = np.random.default_rng(0)
    labels = np.asfortranarray(rng.integers(0, 7, (40, 30, 50), dtype=np.uint8))
    counts = label_counts(labels)
    for value in range(7):
        assert counts[value] == np.count_nonzero(labels == value)
    weights = rng.random(labels.shape).astype(np.float32)
    assert label_counts(labels, weights)[3] == pytest.approx(weights[labels == 3].sum(), rel=1e-6)


def test_volumes_are_counts_times_voxel_volume():
    labels = np.zeros((10, 10, 10), np.uint8)
    labels[2:6, 2:6, 2:6] = 1  # 64 voxels
    labels[7:9, 7:9, 7:9] = 5  # 8 voxels
    measures = {m.organ: m for m in measure(labels, 0.015, LabelTable.vista3d())}
    assert measures["liver"].voxels == 64 and measures["liver"].volume_ml == pytest.approx(0.96)
    assert measures["right_kidney"].volume_ml == pytest.approx(0.12)
    assert measures["liver"].fat_fraction_pct is None


def test_fat_fraction_uses_interior_voxels_and_noise_correction():
    labels = np.zeros((12, 12, 12), np.uint8)
    labels[2:10, 2:10, 2:10] = 1
    water = np.full(labels.shape, 90.0, np.float32)
    fat = np.full(labels.shape, 10.0, np.float32)
    # Fat around the organ leaks into its boundary voxels (partial volume); the interior is clean.
    edge = (labels == 1) & (interior(labels) == 0)
    fat[edge] = 500.0
    assert fat_fractions(labels, water, fat)[1] == pytest.approx(10.0)
    # Rician floor: a fat-free organ whose fat magnitude is pure noise reads near 0 once corrected.
    sigma = 15.0
    rng = np.random.default_rng(1)
    noise_only = np.hypot(rng.normal(0, sigma, labels.shape), rng.normal(0, sigma, labels.shape)).astype(
        np.float32
    )
    water = np.full(labels.shape, 500.0, np.float32)
    raw = fat_fractions(labels, water, noise_only)[1]
    corrected = fat_fractions(labels, water, noise_only, sigma)[1]
    assert raw > 3.0 and corrected < 1.5


def test_volumes_table_round_trip(tmp_path):
    labels = np.zeros((6, 6, 6), np.uint8)
    labels[1:5, 1:5, 1:5] = 3
    table = LabelTable.vista3d()
    measures = measure(
        labels, 0.1, table, np.full(labels.shape, 80, np.int16), np.full(labels.shape, 20, np.int16)
    )
    path = tmp_path / "volumes.tsv"
    write_volumes(path, measures)
    assert "np.float" not in path.read_text()
    again = read_volumes(path, table)
    assert again == measures
    assert again[0].organ == "spleen" and again[0].fat_fraction_pct == pytest.approx(20.0)
