"""How a case-reasoning evaluation rolls a case out and sums it up: accuracy at 1, 5 and 10 attempts in both
of MedCaseReasoning's candidate readings of "k-shot" (docs/sources.md, MedCaseReasoning), and mean reasoning recall.

- independent: `SAMPLES` (10) single-turn answers per case from the prompt alone (variants `sample-0`...);
  accuracy at k is the unbiased pass@k estimate from those samples (1 - C(n - c, k) / C(n, k), c of n correct).
- sequential: one episode per case with up to `ATTEMPTS` (10; a sequential row's own k) submissions through the server's
  `submit_diagnosis` (variant `sequential`, the episode's submissions as context, as the verl adapter sends
  them); accuracy at k counts the cases whose first correct attempt is among the first k.

Recall is measured on each case's first independent sample. Every answer is scored by the environment's
reward function, so eval and training agree on what is correct, except for how the answer is read: eval
reads it as MedCaseReasoning's harness does (`reference` extraction, a row's `eval_extraction`), training as
the row says (`strict` unless built otherwise; `reward.py` says why). A model samples at the environment's
sample temperature (0.6) unless told otherwise; `results.json` records how (`sampling`). With `--repeats`,
each repeat adds its own samples and its own sequential episode.
"""

from __future__ import annotations

import math
from collections import defaultdict

from case_env.core.bank import Item
from case_env.core.parts import ReportParts, Variant
from case_env.envs.casereason.bank import SEQUENTIAL_RULE

SAMPLES = 10
ATTEMPTS = 10
KS = (1, 5, 10)
SEQUENTIAL = "sequential"


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def variants(item: Item) -> list[Variant]:
    settings = dict(item.extra.get("casereason") or {})
    settings["extraction"] = settings.get("eval_extraction") or "reference"
    single = {"casereason": {**settings, "attempts": 1}}
    multi = {"casereason": {**settings, "attempts": ATTEMPTS}}
    prompt = [dict(m) for m in item.prompt]
    if "submit_diagnosis" not in prompt[-1]["content"]:  # an independent-mode row: say how to attempt
        prompt[-1]["content"] += "\n\n" + SEQUENTIAL_RULE.format(k=ATTEMPTS)
    samples = [
        Variant(f"sample-{s}", single, {"attempts": 1}, tools=False, max_turns=1, sample=s)
        for s in range(SAMPLES)
    ]
    return [*samples, Variant(SEQUENTIAL, multi, {"attempts": ATTEMPTS}, prompt, max_turns=ATTEMPTS + 2)]


def sample_index(variant: Variant, repeat: int, seed: int) -> int:
    """Which draw of the reader a sample variant is: repeats and seeds draw new samples."""
    return int(variant.sample or 0) + SAMPLES * (seed + repeat)


def _case(rows: list[dict]) -> dict:
    samples = [r for r in rows if r["variant"] != SEQUENTIAL]
    sequential = [r for r in rows if r["variant"] == SEQUENTIAL]
    firsts = [r for r in samples if r["variant"] == "sample-0"]
    return {
        "samples": len(samples),
        "correct": sum(int(r["score"]["acc"]) for r in samples),
        "firsts": [r["score"]["first_correct"] for r in sequential],
        "attempts": [r["score"]["attempts"] for r in sequential],
        "recall": sum(r["score"]["recall"] for r in firsts) / len(firsts) if firsts else 0.0,
        "format_ok": sum(bool(r["format_ok"]) for r in firsts) / len(firsts) if firsts else 0.0,
    }


def _block(cases: list[dict]) -> dict:
    n = len(cases)
    samples = min((c["samples"] for c in cases), default=0)
    independent = {
        f"acc@{k}": round(sum(pass_at_k(c["samples"], c["correct"], k) for c in cases) / n, 4)
        for k in KS
        if k <= samples
    }
    episodes = [(first, c) for c in cases for first in c["firsts"]]
    seq = {
        f"acc@{k}": round(sum(0 < first <= k for first, _ in episodes) / len(episodes), 4)
        if episodes
        else 0.0
        for k in KS
        if k <= ATTEMPTS
    }
    attempts = [a for c in cases for a in c["attempts"]]
    return {
        "n": n,
        "independent": independent,
        "sequential": seq,
        "recall": round(sum(c["recall"] for c in cases) / n, 4),
        "format_error_rate": round(sum(1 - c["format_ok"] for c in cases) / n, 4),
        "mean_sequential_attempts": round(sum(attempts) / len(attempts), 3) if attempts else 0.0,
    }


def summarise(records: list[dict]) -> dict:
    by_case: dict[str, list[dict]] = defaultdict(list)
    source: dict[str, str] = {}
    for r in records:
        by_case[r["question_id"]].append(r)
        source[r["question_id"]] = r["data_source"]
    cases = {key: _case(rows) for key, rows in sorted(by_case.items())}
    by_source: dict[str, list[dict]] = defaultdict(list)
    for key, case in cases.items():
        by_source[source[key]].append(case)
    return {
        "samples": max((c["samples"] for c in cases.values()), default=0),
        "attempts": ATTEMPTS,
        "overall": _block(list(cases.values())),
        "by_data_source": {k: _block(v) for k, v in sorted(by_source.items())},
    }


def summary_lines(results: dict) -> list[str]:
    lines = [
        f"{'data source':14s} {'n':>4s} {'mode':12s} {'acc@1':>6s} {'acc@5':>6s} {'acc@10':>7s} {'recall':>7s}"
    ]
    for name, g in {**results["by_data_source"], "overall": results["overall"]}.items():
        for mode in ("independent", SEQUENTIAL):
            a = g[mode]
            lines.append(
                f"{name:14s} {g['n']:4d} {mode:12s} {a.get('acc@1', 0):6.3f} {a.get('acc@5', 0):6.3f} "
                f"{a.get('acc@10', 0):7.3f} {g['recall']:7.3f}"
            )
    return lines


def _rows(results: dict) -> list[list[str]]:
    rows = []
    for name, g in {**results["by_data_source"], "overall": results["overall"]}.items():
        cells = [
            f"{g[mode].get(f'acc@{k}', float('nan')):.3f}" for mode in ("independent", SEQUENTIAL) for k in KS
        ]
        rows.append([name, str(g["n"]), *cells, f"{g['recall']:.3f}", f"{g['format_error_rate']:.3f}"])
    return rows


def accuracy_at_k_plot(runs: list[tuple[str, dict]]) -> bytes:
    """Accuracy against attempts k, one line per run and reading of k-shot (solid independent pass@k, dashed
    sequential)."""
    from case_env.eval.report import figure, png

    fig, ax = figure(7.2, 3.8)
    for i, (label, results) in enumerate(runs):
        for mode, style in (("independent", "-o"), (SEQUENTIAL, "--s")):
            points = [
                (k, results["overall"][mode][f"acc@{k}"])
                for k in KS
                if f"acc@{k}" in results["overall"][mode]
            ]
            if points:
                ks, accs = zip(*points, strict=True)
                ax.plot(ks, accs, style, color=f"C{i}", label=f"{label} ({mode})")
    ax.set_xticks(KS)
    ax.set_xlabel("attempts k")
    ax.set_ylabel("diagnostic accuracy at k")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    return png(fig)


def report(runs: list[tuple[str, dict]], records: list[dict]) -> ReportParts:
    header = [
        "",
        "n",
        *(f"{m[:3]} acc@{k}" for m in ("independent", SEQUENTIAL) for k in KS),
        "recall",
        "format errors",
    ]
    tables = [
        (
            f"{label}: by data source" if len(runs) > 1 else "Accuracy at k",
            "accuracy" if i == 0 else f"accuracy-{i}",
            header,
            _rows(results),
        )
        for i, (label, results) in enumerate(runs)
    ]
    overall = runs[0][1]["overall"]
    headline = (
        f"accuracy at 1 <b>{overall['independent'].get('acc@1', 0):.3f}</b> (independent), "
        f"<b>{overall[SEQUENTIAL].get('acc@1', 0):.3f}</b> (sequential) over {overall['n']} cases; "
        f"reasoning recall {overall['recall']:.3f}"
    )
    notes = (
        "<p>ind: pass@k from independent single-turn samples; seq: a case counts at k when its first correct "
        "submission through <code>submit_diagnosis</code> is among the first k (MedCaseReasoning's two readings "
        "of k-shot). Recall: the share of the clinician's reasoning statements the first sample's thinking covers.</p>"
    )
    return ReportParts(headline, tables, [accuracy_at_k_plot(runs)], "Accuracy at k attempts", notes)
