"""Imaging-derived phenotypes of a data root: UK Biobank's own measurements, beside ours.

`phenotype/idps.tsv` (optional, with a JSON sidecar) holds one row per participant and visit: `participant_id`
or `eid`, `instance` (2 or 3, the UK Biobank instance) or `session_id`, and any of `<organ>_volume_ml`
(organ named as the tools name it: `liver_volume_ml`, `spleen_volume_ml`, `left_kidney_volume_ml`, ...) and
`liver_pdff_pct`. A user fills the columns from the fields of their application; the names are ours.

`case-env data check` sets our volumetry beside them per visit, so a user sees whether their label maps
agree with UK Biobank's own numbers before building a bank on them. PDFF and our signal fat fraction are not
the same quantity (data/README.md, Volumetry): both are shown, neither is judged against the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from case_env.envs.imaging.clinical import ParticipantKeys
from case_env.envs.imaging.tsv import TsvError, read_table

if TYPE_CHECKING:
    from case_env.envs.imaging.data.store import PatientStore

IDPS = Path("phenotype") / "idps.tsv"
VOLUME_SUFFIX = "_volume_ml"
PDFF = "liver_pdff_pct"
DISAGREE_PCT = 10.0  # a volume this far from UK Biobank's is worth a look (segmentations differ by a few %)


IDP_ORGANS = ("liver", "spleen", "pancreas", "left_kidney", "right_kidney")
SIDECAR = {
    **{
        f"{organ}{VOLUME_SUFFIX}": {"Description": f"{organ.replace('_', ' ')} volume", "Units": "mL"}
        for organ in IDP_ORGANS
    },
    PDFF: {"Description": "liver proton density fat fraction", "Units": "%"},
    "instance": {"Description": "UK Biobank instance (2: first imaging visit, 3: repeat imaging)"},
}


def write_idps(root: Path, rows: list[tuple[str, str, int, dict[str, float]]]) -> Path:
    """The table and its sidecar, from rows of (participant_id, eid, instance, measures)."""
    import json

    from case_env.envs.imaging.tsv import write_tsv

    columns = [f"{o}{VOLUME_SUFFIX}" for o in IDP_ORGANS] + [PDFF]
    path = root / IDPS
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tsv(
        path,
        ["participant_id", "eid", "instance", *columns],
        [[pid, eid, instance, *(m.get(c, "n/a") for c in columns)] for pid, eid, instance, m in rows],
    )
    path.with_suffix(".json").write_text(json.dumps(SIDECAR, indent=2) + "\n", encoding="utf-8")
    return path


@dataclass
class IdpTable:
    values: dict[tuple[str, str], dict[str, float]]  # (patient id, visit) -> column -> value
    problems: list[str]
    source: str


def load_idps(store: PatientStore, path: Path | None = None) -> IdpTable | None:
    path = path or store.root / IDPS
    if not path.is_file():
        return None
    try:
        rows = read_table(path)
    except (OSError, TsvError) as exc:
        return IdpTable({}, [f"{path.name}: cannot read the phenotype table ({exc})"], str(path))
    keys, sessions = ParticipantKeys.of(store), {}
    for pid in store.patient_ids():
        for n, vf in enumerate(store.patient(pid).visits):
            sessions[(pid, vf.session)] = vf.visit
            sessions[(pid, f"instance {n + 2}")] = vf.visit  # instance 2 is the first imaging visit
    values: dict[tuple[str, str], dict[str, float]] = {}
    problems = []
    for n, row in enumerate(rows, start=2):
        where = f"{path.name} line {n}"
        pid, named = keys.resolve(row)
        if not pid:
            problems.append(f"{where}: {named} is not in the data root's participants.tsv")
            continue
        key = row.get("session_id") or (f"instance {row['instance']}" if row.get("instance") else "")
        visit = sessions.get((pid, key))
        if visit is None:
            problems.append(f"{where}: {pid} has no visit {key or '(no instance or session_id)'}")
            continue
        measures = {}
        for column, text in row.items():
            if not (column.endswith(VOLUME_SUFFIX) or column == PDFF) or text in ("", "n/a", "NA"):
                continue
            try:
                measures[column] = float(text)
            except ValueError:
                problems.append(f"{where}: {column} {text!r} is not a number")
        values[(pid, visit)] = measures
    return IdpTable(values, problems, str(path))


def compare(store: PatientStore, table: IdpTable) -> tuple[list[str], list[str]]:
    """Printed lines (ours beside UK Biobank's, per visit) and warnings for volumes that disagree."""
    lines, warnings = [], []
    for (pid, visit), measures in sorted(table.values.items()):
        ours = store.volumetry(pid, visit)
        cells = []
        for column, theirs in sorted(measures.items()):
            if column == PDFF:
                fat = ours.get("liver")
                signal = f"{fat.fat_fraction_pct:.1f} %" if fat and fat.fat_fraction_pct is not None else "-"
                cells.append(f"liver PDFF {theirs:.1f} % (our signal fat fraction {signal})")
                continue
            organ = column[: -len(VOLUME_SUFFIX)]
            measured = ours.get(organ)
            if measured is None:
                cells.append(f"{organ} {theirs:,.1f} mL (not in our label map)")
                continue
            diff = 100.0 * (measured.volume_ml - theirs) / theirs if theirs else float("inf")
            cells.append(f"{organ} {measured.volume_ml:,.1f} vs {theirs:,.1f} mL ({diff:+.1f} %)")
            if abs(diff) > DISAGREE_PCT:
                warnings.append(
                    f"{pid} {visit}: {organ} measures {measured.volume_ml:,.1f} mL, UK Biobank's phenotype "
                    f"says {theirs:,.1f} mL ({diff:+.1f} %)"
                )
        lines.append(f"  {pid} {visit}: " + "; ".join(cells))
    return lines, warnings
