"""report.html of a clinic evaluation: tables by data source and by noise type, the cost-accuracy plot,
and the first conversations. One or several runs (agents) can share a page, which is how the acceptance
script puts the scripted and the no-exam clinician, clean and noisy, on one Pareto plot."""

from __future__ import annotations

import html
import io
from pathlib import Path

from case_env.eval.report import _SELF_CHECK, _STYLE, _data_uri

SHOWN = 30
COLUMNS = (("n", "n", "{:d}"), ("strict acc", "accuracy_strict", "{:.3f}"),
           ("lenient acc", "accuracy_lenient", "{:.3f}"), ("reward", "reward", "{:.3f}"),
           ("cost", "cost", "{:.3f}"), ("exams", "exams", "{:.2f}"), ("questions", "questions", "{:.2f}"),
           ("turns", "turns", "{:.2f}"), ("exam approp.", "exam_appropriateness", "{:.3f}"))  # fmt: skip


def _table(title: str, table_id: str, groups: dict[str, dict]) -> str:
    head = "".join(f"<th>{html.escape(c[0])}</th>" for c in COLUMNS)
    body = "".join(
        f"<tr><td>{html.escape(name)}</td>" + "".join(f"<td>{fmt.format(g[key])}</td>" for _, key, fmt in COLUMNS)
        + "</tr>" for name, g in groups.items()
    )  # fmt: skip
    return f"<h2>{title}</h2><table id='{table_id}'><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>"


def cost_accuracy_plot(points: list[tuple[str, float, float]]) -> bytes:
    """(label, mean cost, strict accuracy) as a scatter; the cheaper and more accurate, the better."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.4, 4.2), dpi=100)
    markers = "osD^vP*X"
    for i, (label, cost, accuracy) in enumerate(points):
        ax.scatter([cost], [accuracy], s=45, marker=markers[i % len(markers)], label=label)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
    ax.set_xlabel("mean cost penalty per case (sum of (cost + discomfort) / 6)")
    ax.set_ylabel("strict diagnostic accuracy")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlim(left=-0.05)
    ax.grid(alpha=0.3)
    ax.set_title("Cost against accuracy")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


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


def _conversation(record: dict) -> str:
    verdict = "ok" if record["score"]["acc"] else "wrong"
    parts = [f"<div class='msg assistant'>{html.escape(m['tool'])}({html.escape(str(m['arguments']))})</div>"
             f"<div class='msg tool'>{html.escape(m['observation'])}</div>" for m in record["moves"]]  # fmt: skip
    parts.append(f"<div class='msg assistant'>{html.escape(record['final'] or '(no diagnosis)')}</div>")
    noise = ", ".join(record["noise"]) or "no noise"
    title = (f"{html.escape(record['id'])} · {html.escape(record['ground_truth'])} · "
             f"<span class='{verdict}'>{html.escape(record['score']['pred'] or '-')}</span> · {html.escape(noise)}")  # fmt: skip
    return f"<details><summary>{title}</summary>{''.join(parts)}</details>"


def write_report(out: Path, runs: list[tuple[str, dict]], records: list[dict] | None = None) -> Path:
    sections = []
    for label, results in runs:
        prefix = f"{label}: " if len(runs) > 1 else ""
        sections.append(_table(f"{prefix}by data source", "accuracy", {**results["by_data_source"],
                                                                       "overall": results["overall"]}))  # fmt: skip
        sections.append(_table(f"{prefix}by noise type", "noise", results["by_noise"]))
    plot = _data_uri(cost_accuracy_plot(_points(runs)))
    browser = "".join(_conversation(r) for r in (records or [])[:SHOWN])
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>case-env clinic eval</title>"
            f"<style>{_STYLE}</style><script>{_SELF_CHECK}</script></head><body>"
            f"<h1>Clinic evaluation</h1><p>Runs: {html.escape('; '.join(label for label, _ in runs))}.</p>"
            f"<p>Strict accuracy: every ground-truth condition named; lenient: at least one. Cost: each exam "
            f"ordered charges (cost + discomfort) / 6, recorded work-up exams at a discount.</p>"
            f"<div class='plots'><img style='max-width:840px' alt='cost against accuracy' src='{plot}'></div>{''.join(sections)}"
            f"{'<h2>Conversations</h2>' + browser if browser else ''}</body></html>")  # fmt: skip
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
