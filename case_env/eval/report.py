"""report.html: one self-contained page per eval run (plots and images inlined as data URIs), so it can be
mailed or attached to a paper's supplement. Accuracy by persona, scenario and template; tool-usage plots; a
trajectory browser with every conversation and its images. The page checks its own images after load and
records the result on <body> (data-images-ok / data-images-broken), which the browser test reads."""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter, defaultdict
from pathlib import Path

from case_env.eval import trajectory

BROWSER_LIMIT = 100  # conversations shown; images are inlined, so the page grows with each one

_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#1b1b1b;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 20px}th,td{border:1px solid #ccc;padding:4px 10px;text-align:right}
th:first-child,td:first-child{text-align:left}thead{background:#eef}
.plots img{max-width:520px;margin-right:12px}.msg{margin:6px 0;padding:6px 10px;border-radius:6px;
white-space:pre-wrap}.system{background:#f4f4f4}.user{background:#eef6ff}.assistant{background:#f0fff0}
.tool{background:#fff8e8}.msg img{display:block;max-width:448px;margin:6px 0}.ok{color:#186a18}
.wrong{color:#a31515}summary{cursor:pointer;padding:3px 0}
"""

_SELF_CHECK = """
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.imagesOk = ok;
  document.body.dataset.imagesBroken = imgs.length - ok;
  document.body.dataset.tableRows = document.querySelectorAll('#accuracy tbody tr').length;
});
"""


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _table(title: str, table_id: str, groups: dict[str, list[dict]]) -> str:
    rows = []
    for name, records in sorted(groups.items()):
        n = len(records)
        acc = sum(r["reward"] for r in records) / n
        calls = sum(r["tool_calls"] for r in records) / n
        fmt = sum(not r["format_ok"] for r in records) / n
        rows.append(f"<tr><td>{html.escape(name or '(none)')}</td><td>{n}</td><td>{acc:.3f}</td>"
                    f"<td>{calls:.1f}</td><td>{fmt:.3f}</td></tr>")  # fmt: skip
    head = "<tr><th></th><th>n</th><th>accuracy</th><th>tool calls</th><th>format errors</th></tr>"
    return (
        f"<h2>{title}</h2><table id='{table_id}'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _plots(records: list[dict]) -> list[bytes]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    pngs = []
    by_persona: dict[str, list[int]] = defaultdict(list)
    tools_used: Counter = Counter()
    for r in records:
        by_persona[r["persona"] or r["data_source"]].append(r["tool_calls"])
        for m in r["messages"]:
            for call in m.get("tool_calls") or []:
                tools_used[call["function"]["name"]] += 1
    fig, ax = plt.subplots(figsize=(5.2, 3.2), dpi=100)
    names = sorted(by_persona)
    ax.boxplot([by_persona[n] for n in names], tick_labels=names)
    ax.set_ylabel("tool calls per question")
    ax.set_title("Tool calls by persona")
    pngs.append(_save(fig))
    fig, ax = plt.subplots(figsize=(5.2, 3.2), dpi=100)
    common = tools_used.most_common()
    ax.barh([n for n, _ in common][::-1] or ["(none)"], [c for _, c in common][::-1] or [0], color="#4a78b5")
    ax.set_xlabel("calls")
    ax.set_title("Calls per tool")
    fig.tight_layout()
    pngs.append(_save(fig))
    plt.close("all")
    return pngs


def _save(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _message(message: dict, base: Path) -> str:
    role = message.get("role", "")
    parts = []
    for kind, value in trajectory.content_parts(message.get("content"), role):
        if kind == "text":
            parts.append(html.escape(value))
        else:
            path = base / value
            src = _data_uri(path.read_bytes()) if path.is_file() else ""
            parts.append(f"<img alt='{html.escape(value)}' src='{src}'>")
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        parts.append(f"→ <b>{html.escape(fn['name'])}</b>({html.escape(str(fn['arguments']))})")
    return f"<div class='msg {html.escape(role)}'><b>{html.escape(role)}</b>\n{''.join(parts)}</div>"


def write_report(run: Path) -> Path:
    results = json.loads((run / "results.json").read_text())
    records = list(trajectory.read(run / trajectory.FILENAME))
    by = {key: defaultdict(list) for key in ("persona", "scenario", "template")}
    for r in records:
        for key in by:
            by[key][r.get(key) or ""].append(r)
    plots = "".join(f"<img alt='plot' src='{_data_uri(p)}'>" for p in _plots(records)) if records else ""
    shown = sorted(records, key=lambda r: (r["reward"] >= 1, r["id"]))[:BROWSER_LIMIT]  # wrong ones first
    browser = []
    first_with_images = next((r["id"] for r in shown if r.get("images")), None)
    for r in shown:
        mark = "<span class='ok'>correct</span>" if r["reward"] >= 1 else "<span class='wrong'>wrong</span>"
        summary = (f"{html.escape(r['id'])} · {html.escape(r['persona'])} · {html.escape(r.get('template') or '')}"
                   f" · answer {html.escape(r['answer'] or '-')} (key {html.escape(r['ground_truth'])}) · {mark}")  # fmt: skip
        body = "".join(_message(m, run) for m in r["messages"])
        opened = " open" if r["id"] == first_with_images else ""  # one example unfolded on arrival
        browser.append(f"<details{opened}><summary>{summary}</summary>{body}</details>")
    overall = results["overall"]
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>case-env eval: {html.escape(results['agent'])}</title>
<style>{_STYLE}</style><script>{_SELF_CHECK}</script></head><body>
<h1>case-env evaluation · agent <code>{html.escape(results['agent'])}</code></h1>
<p>bank <code>{html.escape(results['bank'])}</code> · server {html.escape(results['server_version'])} ·
overall accuracy <b>{overall['accuracy']:.3f}</b> over {overall['n']} questions</p>
{_table("Accuracy by persona", "accuracy", by["persona"])}
{_table("Accuracy by scenario", "by-scenario", by["scenario"])}
{_table("Accuracy by template", "by-template", by["template"])}
<h2>Tool usage</h2><div class="plots">{plots}</div>
<h2>Trajectories</h2><p>showing {len(shown)} of {len(records)}</p>{''.join(browser)}
</body></html>"""  # fmt: skip
    out = run / "report.html"
    out.write_text(page, encoding="utf-8")
    return out
