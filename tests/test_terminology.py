"""The ICD-10-CM reading of disease names (issue 34, point 5): synonyms and subtypes within one category from
the tabular list the simple_icd_10_cm package ships, siblings and Excludes1 pairs kept apart, and the graders'
agreement with labelled pairs committed before the code (tests/data/terminology_pairs.csv, 3a8c713)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from case_env.envs.casereason.grader import grade
from case_env.medicine import terminology
from case_env.medicine.diagnosis import same_condition

PAIRS = list(
    csv.DictReader((Path(__file__).parent / "data" / "terminology_pairs.csv").open(encoding="utf-8"))
)


@pytest.mark.parametrize(
    ("first", "second", "related"),
    [
        ("visceral leishmaniasis", "kala-azar", True),  # B55.0 includes "Kala-azar"
        ("eosinophilic granulomatosis with polyangiitis", "Churg-Strauss syndrome", True),  # M30.1's bracket
        ("aggressive fibromatosis", "desmoid tumor", True),  # D48.1 includes it
        ("infectious mononucleosis", "cytomegaloviral mononucleosis", True),  # B27 and its subtype B27.1
        ("Epstein-Barr virus mononucleosis", "infectious mononucleosis", True),  # "due to" read both ways
        ("Sheehan's syndrome", "Sheehan syndrome", True),  # possessives fold
        ("cutaneous leishmaniasis", "visceral leishmaniasis", False),  # siblings in B55
        ("Hodgkin lymphoma", "follicular lymphoma", False),  # C81 and C82
        ("type 1 diabetes mellitus", "type 2 diabetes mellitus", False),
        ("Crohn disease", "ulcerative colitis", False),
        ("visceral leishmaniasis", "a condition no list holds", None),  # unknown: the caller's rules decide
    ],
)
def test_names_are_related_through_the_tabular_list(first, second, related):
    assert terminology.related(first, second) is related
    assert terminology.related(second, first) is related


def test_excludes1_keeps_codes_apart_and_a_missing_package_knows_nothing(monkeypatch):
    terms = terminology.icd10cm()
    assert terms is not None and terms.version == "2026"
    # C88.0 Waldenström macroglobulinemia: Excludes1 small cell B-cell lymphoma (C83.0), which includes
    # lymphoplasmacytic lymphoma
    assert terminology.exclusive("Waldenstrom macroglobulinemia", "lymphoplasmacytic lymphoma")
    assert terminology.related("Waldenstrom macroglobulinemia", "lymphoplasmacytic lymphoma") is False
    assert terms.lineage("B55.0") == ["B55.0", "B55"]
    monkeypatch.setattr(terminology, "tabular_path", lambda: None)
    terminology.icd10cm.cache_clear()
    try:
        assert terminology.related("visceral leishmaniasis", "kala-azar") is None
        assert terminology.exclusive("visceral leishmaniasis", "kala-azar") is False
    finally:
        terminology.icd10cm.cache_clear()


def test_the_index_is_read_back_from_its_cache_as_parsed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    stale = tmp_path / "case-env" / "icd10cm-2-icd10cm-tabular.xml-1-2.json"  # a list installed before
    stale.parent.mkdir()
    stale.write_text("{}")
    terminology.icd10cm.cache_clear()
    try:
        parsed = terminology.icd10cm()  # parsed, then written, the stale index removed
        assert [p.name for p in (tmp_path / "case-env").glob("icd10cm-*.json")] == [
            terminology._cache_file(terminology.tabular_path()).name
        ]
        terminology.icd10cm.cache_clear()
        again = terminology.icd10cm()  # read back
        assert again.codes == parsed.codes and again.parent == parsed.parent
        assert again.excludes == parsed.excludes and again.version == parsed.version
    finally:
        terminology.icd10cm.cache_clear()


def _agreement(judged) -> tuple[int, int]:
    verdicts = [(judged(r["predicted"], r["truth"]), r["correct"] == "1") for r in PAIRS]
    return sum(v == label for v, label in verdicts), sum(v and not label for v, label in verdicts)


def test_the_graders_agree_with_the_terminology_pairs_labelled_before_the_code(monkeypatch):
    assert len(PAIRS) == 60 and {r["part"] for r in PAIRS} == {"terminology"}
    # the figures in docs/sources.md: with ICD-10-CM
    assert _agreement(grade) == (
        49,
        1,
    )  # the one false accept is the rules' (acute vs constrictive pericarditis)
    assert _agreement(same_condition) == (44, 0)
    # and without it (the rules alone)
    monkeypatch.setattr(terminology, "related", lambda first, second: None)
    assert _agreement(grade) == (37, 1)
    assert _agreement(same_condition) == (26, 0)
