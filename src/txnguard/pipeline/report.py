"""report.html: the tables as plots (matplotlib, PNG) and short tables a person reads.

The plots are embedded as data: URIs, so the page is one file that opens anywhere; the same PNGs are
also written beside it. A small inline script stamps `data-images-ok` on <body> once every image has
decoded: the browser test reads it (a broken image leaves a count below the total).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG only

import matplotlib.pyplot as plt

TOP_IDS = 15
UNPROXIED_SHOWN = 100  # rows of the unproxied ids on the page (the table has them all)


@dataclass
class ReportData:
    """What the report shows, already collected from the tables (small: aggregates only)."""

    title: str
    totals: dict[str, int]
    rejections_by_hour: list[tuple[Any, str, int]]         # (hour, reason, count)
    latency_by_evidence: list[tuple[str, int, float, float, float, float]]  # evidence, n, p50, p95, p99, max
    inventory: list[dict[str, Any]]
    top_transactional_ids: list[tuple[str, int]]
    incidents: list[tuple[str, bool, int, str]]            # incident, prevented, count, consequence
    quarantine: list[tuple[str, int]]                      # reason kind, count
    # ending, decision, holds, p50 held ms, max held ms (requests held behind an EndTxn in doubt, KAFKA-17754)
    end_txn_holds: list[tuple[str, str, int, float, float]] = field(default_factory=list)
    # Transactional ids active in the cluster's log that no proxy saw (`unproxied_transactional_ids`), the most
    # recently active first, at most UNPROXIED_SHOWN: id, state, last activity, producer id, reported by
    unproxied: list[tuple[str, str, Any, int, list[str]]] = field(default_factory=list)
    unproxied_total: int = 0
    plots: dict[str, bytes] = field(default_factory=dict)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this period", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_rejections(rows: Sequence[tuple[Any, str, int]]) -> bytes:
    fig, ax = plt.subplots(figsize=(9, 3.6))
    if not rows:
        _empty(ax, "rejections")
    else:
        hours = sorted({h for h, _, _ in rows})
        reasons = sorted({r for _, r, _ in rows})
        counts = {(h, r): c for h, r, c in rows}
        bottom = [0] * len(hours)
        for reason in reasons:
            values = [counts.get((h, reason), 0) for h in hours]
            ax.bar([h.strftime("%m-%d %H:00") for h in hours], values, bottom=bottom, label=reason)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.legend(fontsize=8)
        ax.set_ylabel("failed verifications")
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.set_title("Rejections over time by reason (per hour, UTC)")
    return _png(fig)


def plot_latency(rows: Sequence[tuple[str, int, float, float, float, float]]) -> bytes:
    fig, ax = plt.subplots(figsize=(9, 3.6))
    if not rows:
        _empty(ax, "verifications")
    else:
        names = [f"{e}\n(n={n})" for e, n, *_ in rows]
        width = 0.25
        for i, (label, idx) in enumerate((("p50", 2), ("p95", 3), ("p99", 4))):
            ax.bar([x + (i - 1) * width for x in range(len(rows))], [r[idx] for r in rows], width, label=label)
        ax.set_xticks(range(len(rows)), names, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("VerificationTimeMs (log)")
        ax.legend(fontsize=8)
    ax.set_title("Verification latency percentiles by evidence path")
    return _png(fig)


def plot_inventory(rows: Sequence[dict[str, Any]]) -> bytes:
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.35 * len(rows) + 1)))
    if not rows:
        _empty(ax, "clients")
    else:
        labels = [f"{r['client_family']} {r['client_software_name'] or '?'} {r['client_software_version'] or '?'}"
                  for r in rows]
        seen = [int(r["connections"]) + int(r["decisions"]) for r in rows]
        colors = ["tab:red" if r["pre_tv2"] else "tab:green" for r in rows]
        ax.barh(labels, seen, color=colors)
        ax.invert_yaxis()
        ax.set_xlabel("connections + decisions (red: pre-TV2, needs the proxy)")
        ax.tick_params(axis="y", labelsize=8)
    ax.set_title("Client inventory by family and version")
    return _png(fig)


def plot_top_ids(rows: Sequence[tuple[str, int]]) -> bytes:
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.35 * len(rows) + 1)))
    if not rows:
        _empty(ax, "rejected transactional ids")
    else:
        ax.barh([t for t, _ in rows], [c for _, c in rows], color="tab:orange")
        ax.invert_yaxis()
        ax.set_xlabel("failed verifications")
        ax.tick_params(axis="y", labelsize=8)
    ax.set_title(f"Top {TOP_IDS} offending transactional ids")
    return _png(fig)


def render_plots(data: ReportData) -> None:
    data.plots = {
        "rejections_over_time": plot_rejections(data.rejections_by_hour),
        "latency_by_evidence": plot_latency(data.latency_by_evidence),
        "inventory_by_family": plot_inventory(data.inventory),
        "top_transactional_ids": plot_top_ids(data.top_transactional_ids),
    }


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_text(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _some(values: Sequence[Any], shown: int = 4) -> str:
    """A long list (a client id per instance) cut to its first few, with how many there are."""
    values = list(values or [])
    head = ", ".join(str(v) for v in values[:shown])
    return head if len(values) <= shown else f"{head} ... ({len(values)} in all)"


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value)
    return str(value)


_STYLE = """body{font-family:sans-serif;margin:24px;color:#222;max-width:1000px}
table{border-collapse:collapse;margin:8px 0 20px;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left}th{background:#f0f0f0}img{display:block;margin:8px 0 24px;max-width:100%}
.totals td:last-child{text-align:right}"""

# Counts the images that decoded; the browser test fails on anything less than all of them.
_SELF_CHECK = """window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images-ok', ok + '/' + imgs.length);
});"""


def render_html(data: ReportData) -> str:
    def img(name: str, alt: str) -> str:
        b64 = base64.b64encode(data.plots[name]).decode("ascii")
        return f'<img id="{name}" alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'

    inventory_rows = [
        (r["client_family"], r["client_software_name"], r["client_software_version"], "yes" if r["pre_tv2"] else "no",
         r["connections"], r["decisions"], r["rejections"], r["unenforced_rejections"], _some(r["client_ids"]),
         r["first_seen"], r["last_seen"]) for r in data.inventory]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(data.title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(data.title)}</h1>",
        "<h2>Totals</h2>", _table(["what", "records"], list(data.totals.items())).replace("<table>",
                                                                                       '<table class="totals">'),
        "<h2>Rejections</h2>", img("rejections_over_time", "rejections over time by reason"),
        "<h2>What the rejections prevented</h2>",
        _table(["incident", "prevented (enforce)", "count", "what would have happened"], data.incidents),
        img("top_transactional_ids", "top offending transactional ids"),
        "<h2>Verification cost</h2>", img("latency_by_evidence", "latency percentiles by evidence path"),
        _table(["evidence", "verifications", "p50 ms", "p95 ms", "p99 ms", "max ms"], data.latency_by_evidence),
        "<h2>Client inventory</h2>", img("inventory_by_family", "client inventory by family and version"),
        _table(["family", "software", "version", "pre-TV2", "connections", "decisions", "rejected",
                "monitor-only", "client ids", "first seen", "last seen"], inventory_rows),
        "<h2>Requests held behind an EndTxn in doubt (KAFKA-17754)</h2>",
        _table(["ending", "decision", "holds", "p50 held ms", "max held ms"], data.end_txn_holds)
        if data.end_txn_holds else "<p>No request was held.</p>",
        "<h2>Clients that bypass txnguard</h2>", _unproxied(data),
        "<h2>Quarantine</h2>",
        _table(["reason", "lines"], data.quarantine) if data.quarantine else "<p>No line was quarantined.</p>",
        f"<script>{_SELF_CHECK}</script>", "</body></html>",
    ]
    return "\n".join(parts)


def _unproxied(data: ReportData) -> str:
    if not data.unproxied:
        return ("<p>No transactional id active in the cluster's log went around the proxies (or no proxy listed the "
                "log's ids: <code>audit.transaction_log_ids_interval_s</code>).</p>")
    shown = len(data.unproxied)
    more = f" The {shown} most recently active are shown; the table has every one." if data.unproxied_total > shown \
        else ""
    return (f"<p>{data.unproxied_total} transactional ids active in the cluster's log that no proxy saw in a request: "
            f"clients that reach the brokers another way.{more}</p>"
            + _table(["transactional id", "state in the log", "last activity", "producer id", "listed by"],
                     data.unproxied))


def write(data: ReportData, out: Path) -> Path:
    """Render plots and page into `out`; returns the path of report.html."""
    render_plots(data)
    images = out / "report_images"
    images.mkdir(parents=True, exist_ok=True)
    for name, png in data.plots.items():
        (images / f"{name}.png").write_bytes(png)
    page = out / "report.html"
    tmp = page.with_suffix(".html.tmp")
    tmp.write_text(render_html(data), encoding="utf-8")
    tmp.replace(page)  # a reader never sees half a page (the streaming job rewrites it)
    return page
