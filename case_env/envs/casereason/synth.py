"""Original synthetic cases in MedCaseReasoning's format, from the look-alike table (`lookalikes.py`).

A case is one member of a group of eight look-alikes. Its presentation is the group's complaint and
examination (the same for all eight), the history (the member's risk factor in `RISK_SHOWN` of cases,
other members' risk factors as decoys), and the investigations: normal results of `EXCLUDED` look-alikes'
deciding tests and, in `CONFIRMED` of cases, the member's own abnormal result. The reasoning statements
follow the dataset's style: the differential, why each excluded look-alike was set aside, what pointed at
the diagnosis and what confirmed it. So the results decide: a reader who ignores them ranks eight
candidates by risk factors alone, which five attempts often do not cover.
"""

from __future__ import annotations

import json
from pathlib import Path

from case_env.core.frozen import FrozenDraw
from case_env.envs.casereason.lookalikes import GROUPS, Member

CONFIRMED = 0.6  # share of cases whose presentation includes the confirming result
RISK_SHOWN = 0.4  # share of cases whose history names the diagnosis's own risk factor
DECOYS = 2  # other members' risk factors in every history
EXCLUDED = 3  # look-alikes whose deciding test is reported normal


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def make_reasoning_case(index: int, seed: int) -> dict:
    """One MedCaseReasoning-format row (a dict with its columns)."""
    draw = FrozenDraw(seed, f"casereason/{index}")
    group = GROUPS[index % len(GROUPS)]
    member = draw.choice("member", list(group.members))
    others = draw.shuffled("others", [m for m in group.members if m is not member])
    excluded, decoys = others[:EXCLUDED], others[EXCLUDED : EXCLUDED + DECOYS]
    confirmed = draw.chance("confirmed", CONFIRMED)
    risky = draw.chance("risk", RISK_SHOWN)
    age = draw.integer("age", *group.ages)
    sex = draw.choice("sex", ["man", "woman"])
    history = draw.shuffled("history", [m.risk for m in decoys] + ([member.risk] if risky else []))
    results: list[Member] = ([member] if confirmed else []) + list(excluded)
    shown = draw.shuffled("results", results)
    investigations = "; ".join(f"{m.test}: {m.abnormal if m is member else m.normal}" for m in shown)
    prompt = (
        f"A {age}-year-old {sex} presented with {group.complaint}. {group.examination} "
        f"The patient {' and '.join(history)}. Investigations: {investigations}."
    )
    differential = [m.name for m in draw.shuffled("differential", [*excluded, *decoys[:1], member])]
    reasoning = [
        f"{_capital(group.complaint)} raised a differential including {', '.join(differential[:-1])} and "
        f"{differential[-1]}."
    ]
    reasoning += [
        f"{_capital(m.name)} was considered less likely because the {m.test} showed {m.normal}."
        for m in excluded[:2]
    ]
    if risky:
        reasoning.append(f"The history (the patient {member.risk}) pointed towards {member.name}.")
    if confirmed:
        reasoning.append(f"The {member.test} showing {member.abnormal} confirmed {member.name}.")
    else:
        reasoning.append(
            f"With its look-alikes excluded, {member.name} remained; the {member.test} would confirm it."
        )
    return {
        "pmcid": f"SYN{seed:02d}{index:05d}",
        "title": f"Synthetic case {index + 1}: {group.name}",
        "journal": "case-env synthetic",
        "article_link": "",
        "publication_date": "",
        "text": "",
        "case_prompt": prompt,
        "diagnostic_reasoning": "\n".join(f"{i}. {s}" for i, s in enumerate(reasoning, 1)),
        "final_diagnosis": member.name,
    }


def write_cases(n: int, seed: int, path: Path) -> list[dict]:
    rows = [make_reasoning_case(i, seed) for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return rows
