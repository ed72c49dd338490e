"""How a clinic evaluation is summarised: strict and lenient accuracy, diagnosis Jaccard, reward, mean cost,
exams, questions and turns per case, by data source and by noise type; beside them MedExAgent's evaluation
metrics (`evaluation/metrics.py`: strict and lenient accuracy, the judge's Jaccard, the ToolRL tool score)
and the exam cost it does not report but logs in training, recomputed from the exams ordered (total
cost + discomfort, and the part outside the work-up); in report.html the cost-accuracy plot (one point per
run, or the clean and noisy cases of one run) and the same tables.

A turn is one assistant message (every tool call, and the diagnosis), the same definition for every
environment.
"""

from __future__ import annotations

from collections import defaultdict

from case_env.core.parts import ReportParts

COLUMNS = (
    ("n", "n", "{:d}"),
    ("strict acc", "accuracy_strict", "{:.3f}"),
    ("lenient acc", "accuracy_lenient", "{:.3f}"),
    ("reward", "reward", "{:.3f}"),
    ("cost", "cost", "{:.3f}"),
    ("exams", "exams", "{:.2f}"),
    ("questions", "questions", "{:.2f}"),
    ("turns", "turns", "{:.2f}"),
    ("exam term", "exam_appropriateness", "{:.3f}"),
    ("dx Jaccard", "diagnosis_jaccard", "{:.3f}"),
    ("tool score", "tool_match", "{:.3f}"),
    ("exam cost", "tool_cost_total", "{:.2f}"),
    ("unneeded cost", "tool_cost_unnecessary", "{:.2f}"),
    ("dx found", "diagnosis_found", "{:.3f}"),
    ("hallucinated", "tool_hallucination_rate", "{:.3f}"),
)


def _mean(rows: list[dict], key: str) -> float:
    return round(sum(float(r[key]) for r in rows) / len(rows), 4) if rows else 0.0


def group_summary(rows: list[dict]) -> dict:
    return {
        "n": len(rows),
        "accuracy_strict": _mean(rows, "acc"),
        "accuracy_lenient": _mean(rows, "acc_lenient"),
        "diagnosis_jaccard": _mean(rows, "dx"),
        "reward": _mean(rows, "score"),
        "cost": _mean(rows, "cost"),
        "exam_appropriateness": _mean(rows, "exam_score"),
        "exams": _mean(rows, "exams"),
        "questions": _mean(rows, "asks"),
        "turns": _mean(rows, "turns"),
        "format_error_rate": round(1 - _mean(rows, "format_ok"), 4) if rows else 0.0,
        "tool_match": _mean(rows, "tool_match"),
        "format_penalty": _mean(rows, "format"),
        "tool_cost_total": _mean(rows, "tool_cost_total"),
        "tool_cost_unnecessary": _mean(rows, "tool_cost_unnecessary"),
        # MedExAgent's evaluation metrics beside ours (evaluation/runners.py): a diagnosis was given; the
        # share of exam calls outside the case's tool list; exam calls per case
        "diagnosis_found": round(sum(bool(r["pred"]) for r in rows) / len(rows), 4) if rows else 0.0,
        "tool_hallucination_rate": _mean(rows, "hallucination_rate"),
        "num_tool_calls": _mean(rows, "exams"),
    }


def summarise(records: list[dict]) -> dict:
    by_source: dict[str, list[dict]] = defaultdict(list)
    by_noise: dict[str, list[dict]] = defaultdict(list)
    everything = []
    for r in records:
        score = r["score"]
        rate = score.get("hallucinated", 0) / score["exams"] if score.get("exams") else 0.0
        row = {**score, "turns": r["turns"], "hallucination_rate": rate}
        everything.append(row)
        by_source[r["data_source"]].append(row)
        for label in r["noise"] or ["clean"]:
            by_noise[label].append(row)
        by_noise["any noise" if r["noise"] else "no noise"].append(row)
    return {
        "overall": group_summary(everything),
        "by_data_source": {k: group_summary(v) for k, v in sorted(by_source.items())},
        "by_noise": {k: group_summary(v) for k, v in sorted(by_noise.items())},
    }


def summary_lines(results: dict) -> list[str]:
    lines = [
        f"{'group':22s} {'n':>4s} {'strict':>7s} {'lenient':>8s} {'jaccard':>8s} {'tool':>6s} {'cost':>6s} "
        f"{'exam$':>6s} {'exams':>6s} {'turns':>6s} {'found':>6s} {'halluc':>6s}"
    ]
    groups = {**results["by_data_source"], "overall": results["overall"], **results["by_noise"]}
    for name, g in groups.items():
        lines.append(
            f"{name:22s} {g['n']:4d} {g['accuracy_strict']:7.3f} {g['accuracy_lenient']:8.3f} "
            f"{g['diagnosis_jaccard']:8.3f} {g['tool_match']:6.3f} {g['cost']:6.2f} {g['tool_cost_total']:6.2f} "
            f"{g['exams']:6.2f} {g['turns']:6.2f} {g['diagnosis_found']:6.3f} {g['tool_hallucination_rate']:6.3f}"
        )
    return lines


def cost_accuracy_plot(points: list[tuple[str, float, float]]) -> bytes:
    """(label, mean cost, strict accuracy) as a scatter; the cheaper and more accurate, the better."""
    from case_env.eval.report import figure, png

    fig, ax = figure(8.4, 4.2)
    markers = "osD^vP*X"
    for i, (label, cost, accuracy) in enumerate(points):
        ax.scatter([cost], [accuracy], s=45, marker=markers[i % len(markers)], label=label)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
    ax.set_xlabel("mean cost penalty per case (the reward profile's, in units of the costliest exam)")
    ax.set_ylabel("strict diagnostic accuracy")
    ax.set_ylim(-0.02, 1.05)
    costs = [cost for _, cost, _ in points] or [0.0]
    pad = max(0.05, 0.08 * (max(costs) - min(costs)))  # a lone point sits inside the frame, not on its edge
    ax.set_xlim(min(costs) - pad, max(costs) + pad)
    ax.grid(alpha=0.3)
    ax.set_title("Cost against accuracy")
    return png(fig)


def _points(runs: list[tuple[str, dict]]) -> list[tuple[str, float, float]]:
    """One point per run; a single run's point is split into its clean and noisy cases when it has both."""
    if len(runs) > 1:
        return [(label, r["overall"]["cost"], r["overall"]["accuracy_strict"]) for label, r in runs]
    points = []
    for label, results in runs:
        groups = {k: v for k, v in results["by_noise"].items() if k in ("no noise", "any noise") and v["n"]}
        if len(groups) < 2:
            groups = {"all": results["overall"]}
        for name, g in groups.items():
            points.append((f"{label} ({name})", g["cost"], g["accuracy_strict"]))
    return points


def _rows(groups: dict[str, dict]) -> list[list[str]]:
    return [[name, *(fmt.format(g[key]) for _, key, fmt in COLUMNS)] for name, g in groups.items()]


def report(runs: list[tuple[str, dict]], records: list[dict]) -> ReportParts:
    header = ["", *(c[0] for c in COLUMNS)]
    tables = []
    if len(runs) > 1:  # the page's summary: one row per run, the per-run tables folded below it
        tables.append(
            (
                "Summary: one row per run",
                "summary",
                ["run", *header[1:]],
                _rows({label: r["overall"] for label, r in runs}),
            )
        )
    for i, (label, results) in enumerate(runs):
        prefix = f"{label}: " if len(runs) > 1 else ""
        groups = {**results["by_data_source"], "overall": results["overall"]}
        tables.append(
            (f"{prefix}by data source", "accuracy" if i == 0 else f"accuracy-{i}", header, _rows(groups))
        )
        tables.append((f"{prefix}by noise type", f"noise-{i}", header, _rows(results["by_noise"])))
    notes = (
        "<p>Strict accuracy: every ground-truth condition named; lenient: at least one (MedExAgent's two "
        "accuracies). Cost and exam term follow the bank's reward profile: medexagent charges (cost + "
        "discomfort) / 6 for exams outside the work-up by name and scores exams with ToolRL's tool score; strict "
        "charges every exam, work-up exams at a discount, and credits exam appropriateness. Exam cost and "
        "unneeded cost are MedExAgent's logged totals (cost + discomfort of every exam ordered, and of those "
        "outside the work-up), recomputed from the exams ordered.</p>"
    )
    overall = runs[0][1]["overall"]
    headline = f"strict accuracy <b>{overall['accuracy_strict']:.3f}</b> over {overall['n']} cases"
    return ReportParts(headline, tables, [cost_accuracy_plot(_points(runs))], "Cost against accuracy", notes)
