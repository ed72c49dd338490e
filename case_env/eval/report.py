"""report.html: one self-contained page per eval run (plots and images inlined as data URIs), so it can be
mailed or attached to a paper's supplement. The environment supplies its headline, tables and plots
(`Evaluation.report`); this page adds a trajectory browser with every conversation and its images. The page
checks its own images and layout after load and records them on <body> (data-images-ok / -broken,
data-table-rows for the table with id `accuracy`, data-overflow-x, data-plot-min-width, data-summary-top,
data-plot-top), which the browser tests read."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from case_env.core import trajectory
from case_env.core.environment import Environment
from case_env.core.parts import ReportParts, evaluation_of

BROWSER_LIMIT = 100  # conversations shown; images are inlined, so the page grows with each one

_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px auto;padding:0 24px;color:#1b1b1b;max-width:1180px}
h1{font-size:1.5em}.wide{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:8px 0 20px;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;
text-align:right}th:first-child,td:first-child{text-align:left}thead{background:#eef}
.plots img{max-width:100%;height:auto;margin:0 12px 12px 0}.msg{margin:6px 0;padding:6px 10px;
border-radius:6px;white-space:pre-wrap;overflow-wrap:anywhere}.system{background:#f4f4f4}
.user{background:#eef6ff}.assistant{background:#f0fff0}.tool{background:#fff8e8}
.msg img{display:block;max-width:448px;margin:6px 0}.ok{color:#186a18}.wrong{color:#a31515}
summary{cursor:pointer;padding:3px 0}
"""

_SELF_CHECK = """
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.imagesOk = ok;
  document.body.dataset.imagesBroken = imgs.length - ok;
  document.body.dataset.tableRows = document.querySelectorAll('#accuracy tbody tr').length;
  // the layout, as a reader at this window size sees it: a page wider than the window, the plots' widths,
  // where the summary table and the first plot begin
  const root = document.documentElement;
  document.body.dataset.overflowX = Math.max(0, root.scrollWidth - root.clientWidth);
  const plots = [...document.querySelectorAll('.plots img')].map(i => Math.round(i.getBoundingClientRect().width));
  document.body.dataset.plots = plots.length;
  document.body.dataset.plotMinWidth = plots.length ? Math.min(...plots) : 0;
  const top = e => e ? Math.round(e.getBoundingClientRect().top + window.scrollY) : -1;
  document.body.dataset.summaryTop = top(document.querySelector('table'));
  document.body.dataset.plotTop = top(document.querySelector('.plots img'));
});
"""


def figure(width: float, height: float):
    """A matplotlib figure on the Agg backend (no display), for an environment's plots."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=100)


def png(fig) -> bytes:
    from matplotlib import pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _table(title: str, table_id: str, header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    table = f"<table id='{table_id}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return (
        f"<h2>{html.escape(title)}</h2><div class='wide'>{table}</div>"  # a wide table scrolls, not the page
    )


def _message(message: dict, base: Path) -> str:
    role = message.get("role", "")
    parts = []
    for kind, value in trajectory.content_parts(message.get("content"), role):
        if kind == "text":
            parts.append(html.escape(value))
        else:
            path = base / value
            src = data_uri(path.read_bytes()) if path.is_file() else ""
            parts.append(f"<img alt='{html.escape(value)}' src='{src}'>")
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        parts.append(f"→ <b>{html.escape(fn['name'])}</b>({html.escape(str(fn['arguments']))})")
    return f"<div class='msg {html.escape(role)}'><b>{html.escape(role)}</b>\n{''.join(parts)}</div>"


def _browser(records: list[dict], base: Path) -> str:
    shown = sorted(records, key=lambda r: (r["reward"] >= 1, r["id"]))[:BROWSER_LIMIT]  # wrong ones first
    first_with_images = next((r["id"] for r in shown if r.get("images")), None)
    entries = []
    for r in shown:
        mark = "<span class='ok'>correct</span>" if r["score"]["acc"] else "<span class='wrong'>wrong</span>"
        about = " · ".join(html.escape(str(x)) for x in (r["id"], r.get("persona"), r.get("template")) if x)
        summary = f"{about} · answer {html.escape(r['answer'] or '-')} (key {html.escape(r['ground_truth'])}) · {mark}"
        body = "".join(_message(m, base) for m in r["messages"])
        opened = " open" if r["id"] == first_with_images else ""  # one example unfolded on arrival
        entries.append(f"<details{opened}><summary>{summary}</summary>{body}</details>")
    return f"<h2>Trajectories</h2><p>showing {len(shown)} of {len(records)}</p>{''.join(entries)}"


def write_report(out: Path, env: Environment, runs: list[tuple[str, dict]], records: list[dict]) -> Path:
    """The page of one or several runs (labels and results) of one environment, with `records` browsed: the
    summary (the environment's first table) and its plots first, the other tables folded, then trajectories."""
    parts: ReportParts = evaluation_of(env).report(runs, records)
    first = runs[0][1]
    named = "; ".join(label for label, _ in runs) if len(runs) <= 2 else f"{len(runs)} runs"
    about = " · ".join(
        x
        for x in (
            html.escape(f"bank {first['bank']}") if first.get("bank") else "",
            html.escape(f"server {first['server_version']}") if first.get("server_version") else "",
            parts.headline,
        )
        if x
    )
    plots = "".join(f"<img alt='plot' src='{data_uri(p)}'>" for p in parts.plots)
    summary, *details = parts.tables or [None]
    folded = "".join(_table(*t) for t in details)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>case-env eval: {html.escape(named)}</title>"
        f"<style>{_STYLE}</style><script>{_SELF_CHECK}</script></head><body>"
        f"<h1>case-env evaluation · {html.escape(env.title)} · {html.escape(named)}</h1>"
        + (f"<p>{about}</p>" if about else "")
        + (_table(*summary) if summary else "")
        + (f"<h2>{html.escape(parts.plots_title)}</h2><div class='plots'>{plots}</div>" if plots else "")
        + parts.notes
        + (f"<details><summary>{len(details)} more tables</summary>{folded}</details>" if details else "")
        + (_browser(records, out) if records else "")
        + "</body></html>"
    )
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
