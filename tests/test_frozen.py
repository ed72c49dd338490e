"""The frozen ground-truth randomness: stable across numpy versions and independent per name."""

import statistics

from case_env.core.frozen import FrozenDraw
from case_env.envs.imaging.synth.scenarios import SCENARIOS, scenario_for


def test_pinned_values():
    # blake2b of "seed|scope|name": if these change, every generated dataset and bank silently changes.
    assert f"{FrozenDraw(0, '').unit('a'):.10f}" == "0.6651632845"
    assert FrozenDraw(0, "").integer("b", 1, 6) == 4
    assert FrozenDraw(0, "").child("x").scope == "/x"


def test_names_are_independent():
    d = FrozenDraw(3, "s")
    assert d.unit("a") != d.unit("b")
    assert FrozenDraw(3, "s").unit("a") != FrozenDraw(4, "s").unit("a")
    assert FrozenDraw(3, "s").unit("a") != FrozenDraw(3, "t").unit("a")


def test_distributions_are_sane():
    d = FrozenDraw(5, "dist")
    units = [d.unit(str(i)) for i in range(4000)]
    assert 0.48 < statistics.mean(units) < 0.52
    assert min(units) >= 0 and max(units) < 1
    normals = [d.normal(f"n{i}", 10, 2) for i in range(4000)]
    assert 9.9 < statistics.mean(normals) < 10.1
    assert 1.9 < statistics.stdev(normals) < 2.1
    ints = {d.integer(f"i{i}", 1, 3) for i in range(300)}
    assert ints == {1, 2, 3}


def test_any_ten_consecutive_patients_cover_every_scenario():
    for seed in (0, 1, 11):
        assert {scenario_for(seed, i) for i in range(10)} == set(SCENARIOS)
        assert {scenario_for(seed, i) for i in range(10, 20)} == set(SCENARIOS)
