"""The label convention and the TSV reader that every data root goes through."""

from pathlib import Path

import pytest

from case_env.envs.imaging.labels import ORGAN_IDS, VISTA3D, LabelTable, organ_name, snake
from case_env.envs.imaging.tsv import TsvError, read_tsv, write_tsv


def test_vista3d_table_has_the_published_ids():
    assert len(VISTA3D) == 132
    assert VISTA3D[1] == "liver"
    assert VISTA3D[5] == "right kidney" and VISTA3D[14] == "left kidney"
    assert VISTA3D[33] == "vertebrae L5" and VISTA3D[37] == "vertebrae L1"
    assert VISTA3D[38] == "vertebrae T12" and VISTA3D[49] == "vertebrae T1"
    assert VISTA3D[50] == "vertebrae C7" and VISTA3D[56] == "vertebrae C1"
    assert VISTA3D[98] == "left gluteus maximus" and VISTA3D[107] == "right iliopsoas"
    assert VISTA3D[115] == "heart" and VISTA3D[127] == "vertebrae S1" and VISTA3D[132] == "airway"


def test_organ_names_are_snake_case_and_unique():
    assert ORGAN_IDS["right_kidney"] == 5
    assert ORGAN_IDS["inferior_vena_cava"] == 7
    assert ORGAN_IDS["vertebrae_l5"] == 33
    assert len(ORGAN_IDS) == 132
    assert snake("Left Lung Upper Lobe") == "left_lung_upper_lobe"


@pytest.mark.parametrize(
    ("name", "organ"),
    [
        ("kidney_right", "right_kidney"),
        ("urinary_bladder", "bladder"),
        ("iliopsoas_left", "left_iliopsoas"),
        ("gluteus_maximus_right", "right_gluteus_maximus"),
        ("lung_left", "left_lung"),
        ("vertebrae", "vertebrae"),
        ("liver", "liver"),
        ("right kidney", "right_kidney"),
    ],
)
def test_totalsegmentator_names_map_to_our_organs(name, organ):
    assert organ_name(name) == organ


def test_dseg_table_round_trips(tmp_path: Path):
    path = tmp_path / "desc-organs_dseg.tsv"
    LabelTable.vista3d().write_tsv(path)
    table = LabelTable.read_tsv(path)
    assert table.by_index[1].organ == "liver"
    assert table.by_index[1].totalseg_mr_name == "liver"
    assert table.by_index[14].totalseg_mr_name == "kidney_left"
    assert table.by_organ["spleen"].colour.startswith("#") and len(table.by_organ["spleen"].colour) == 7


def test_a_totalsegmentator_label_table_is_understood(tmp_path: Path):
    path = tmp_path / "dseg.tsv"
    path.write_text("index\tname\n1\tspleen\n2\tkidney_right\n5\tliver\n")
    table = LabelTable.read_tsv(path)
    assert table.organ(1) == "spleen" and table.organ(2) == "right_kidney" and table.organ(5) == "liver"


def test_tsv_round_trip_and_missing_values(tmp_path: Path):
    path = tmp_path / "t.tsv"
    write_tsv(path, ["a", "b"], [[1, None], [2.5, "x"]])
    assert read_tsv(path) == [{"a": "1", "b": "n/a"}, {"a": "2.5", "b": "x"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("a\tb\n1\n", "line 2 has 1 field(s), the header has 2"),
        ("a\ta\n1\t2\n", "duplicate column"),
        ("x\ty\n1\t2\n", "missing column(s) session_id"),
    ],
)
def test_tsv_errors_name_the_problem(tmp_path: Path, text, message):
    path = tmp_path / "bad.tsv"
    path.write_text(text)
    with pytest.raises(TsvError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_tsv(path, required=("session_id",) if "session_id" in message else ())


def test_tsv_rejects_binary(tmp_path: Path):
    path = tmp_path / "bin.tsv"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage\xff\xfe")
    with pytest.raises(TsvError, match="not UTF-8"):
        read_tsv(path)
