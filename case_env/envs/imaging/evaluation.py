"""How an imaging evaluation is summarised: accuracy (the letter's reward, without a weighted rubric) per data
source against chance, tool calls and format errors, and CASE's rubric; in report.html accuracy by persona,
scenario and template and two tool-usage plots."""

from __future__ import annotations

from collections import Counter, defaultdict

from case_env.core.parts import ReportParts
from case_env.envs.imaging import rubric


def _correct(record: dict) -> float:
    return record.get("score", {}).get("acc", record["reward"])


def _accuracy(rows: list[dict]) -> float:
    return round(sum(_correct(r) for r in rows) / len(rows), 4) if rows else 0.0


def summarise(records: list[dict]) -> dict:
    by_source: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_source[record["data_source"]].append(record)
    questions = {r.get("question_id", r["id"]) for r in records}
    return {
        "overall": {
            "accuracy": _accuracy(records),
            "n": len(records),
            "questions": len(questions),
            "repeats": max((r.get("repeat", 0) for r in records), default=0) + 1,
            **_rubric(records),
        },
        "by_data_source": {
            source: {
                "accuracy": _accuracy(rows),
                "n": len(rows),
                "mean_tool_calls": round(sum(r["tool_calls"] for r in rows) / len(rows), 3),
                "format_error_rate": round(sum(not r["format_ok"] for r in rows) / len(rows), 4),
                "chance": round(sum(1 / r["options"] for r in rows) / len(rows), 4),
            }
            for source, rows in sorted(by_source.items())
        },
    }


def summary_lines(results: dict) -> list[str]:
    lines = [
        f"{'data source':18s} {'n':>4s} {'accuracy':>9s} {'chance':>7s} {'tool calls':>11s} {'format err':>11s}"
    ]
    for source, s in results["by_data_source"].items():
        lines.append(
            f"{source:18s} {s['n']:4d} {s['accuracy']:9.3f} {s['chance']:7.3f} "
            f"{s['mean_tool_calls']:11.1f} {s['format_error_rate']:11.3f}"
        )
    overall = results["overall"]
    repeats = overall["repeats"]
    more = f"   ({overall['questions']} questions x {repeats} rollouts)" if repeats > 1 else ""
    lines.append(f"{'overall':18s} {overall['n']:4d} {overall['accuracy']:9.3f}{more}")
    if "rubric" in overall:
        items = "  ".join(f"{k} {v:.3f}" for k, v in overall["rubric_items"].items())
        lines.append(f"rubric {overall['rubric']:.3f}  ({items}; rubric.py)")
    return lines


def _rubric(records: list[dict]) -> dict:
    """The rubric's mean and each item's (rows written before it had one left out)."""
    scored = [r["score"] for r in records if "rubric" in r.get("score", {})]
    if not scored:
        return {}
    items = {k: round(sum(s[f"rubric_{k}"] for s in scored) / len(scored), 4) for k in rubric.ITEMS}
    return {"rubric": round(sum(s["rubric"] for s in scored) / len(scored), 4), "rubric_items": items}


def _group_rows(groups: dict[str, list[dict]]) -> list[list[str]]:
    rows = []
    for name, records in sorted(groups.items()):
        n = len(records)
        rows.append(
            [
                name or "(none)",
                str(n),
                f"{sum(_correct(r) for r in records) / n:.3f}",
                f"{sum(r['tool_calls'] for r in records) / n:.1f}",
                f"{sum(not r['format_ok'] for r in records) / n:.3f}",
            ]
        )
    return rows


def _plots(records: list[dict]) -> list[bytes]:
    from case_env.eval.report import figure, png

    by_persona: dict[str, list[int]] = defaultdict(list)
    tools_used: Counter = Counter()
    for r in records:
        by_persona[r["persona"] or r["data_source"]].append(r["tool_calls"])
        for m in r["messages"]:
            for call in m.get("tool_calls") or []:
                tools_used[call["function"]["name"]] += 1
    fig, ax = figure(6.4, 3.6)
    names = sorted(by_persona)
    ax.boxplot([by_persona[n] for n in names], tick_labels=names)
    ax.set_ylabel("tool calls per question")
    ax.set_title("Tool calls by persona")
    first = png(fig)
    fig, ax = figure(6.4, 3.6)
    common = tools_used.most_common()
    ax.barh([n for n, _ in common][::-1] or ["(none)"], [c for _, c in common][::-1] or [0], color="#4a78b5")
    ax.set_xlabel("calls")
    ax.set_title("Calls per tool")
    return [first, png(fig)]


def report(runs: list[tuple[str, dict]], records: list[dict]) -> ReportParts:
    results = runs[0][1]
    overall = results["overall"]
    header = ["", "n", "accuracy", "tool calls", "format errors"]
    tables = []
    for key, title, table_id in (
        ("persona", "Accuracy by persona", "accuracy"),
        ("scenario", "Accuracy by scenario", "by-scenario"),
        ("template", "Accuracy by template", "by-template"),
    ):
        groups: dict[str, list[dict]] = defaultdict(list)
        for r in records:
            groups[r.get(key) or ""].append(r)
        tables.append((title, table_id, header, _group_rows(groups)))
    headline = f"overall accuracy <b>{overall['accuracy']:.3f}</b> over {overall['n']} questions"
    return ReportParts(headline, tables, _plots(records) if records else [], "Tool usage")
