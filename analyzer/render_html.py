"""The self-contained HTML report: inline SVG charts, no script, no network.

Every value that comes from data is escaped with `html.escape`; the page has
no external reference, so it opens from a file on an air-gapped machine.
"""

from __future__ import annotations

import html
import math
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from tokentrace.analyzer import render_coverage as cov
from tokentrace.analyzer.render import (
    EXAMPLES_SHOWN,
    FINDINGS_ORDER,
    KEEP_MORE_OPTIONS,
    NO_EXAMPLES,
    counted,
    coverage_notes,
    describe_window,
    format_confidence,
    latency_cell,
    legend,
    mixed_services_note,
    no_requests_message,
    noun,
    queue_parts_line,
    shows_no_examples,
)
from tokentrace.analyzer.render import format_ms as _ms
from tokentrace.analyzer.report import BUCKETS, PERCENTILES

W, H, PAD = 720, 220, 44
#: Room left of a chart for its y-axis labels ("999.9 ms" at 10 px, right-aligned).
LEFT = 68
#: The explorer's colours (web/static/app.css `--net` …, app.js COLORS): a bucket or a
#: percentile has one colour in every view tokentrace draws (TTFT, which the explorer's
#: chart does not draw, in its muted grey).
COLORS = {"network": "#8e7cc3", "queue": "#e69138", "prefill": "#3d85c6", "decode": "#6aa84f",
          "e2e_p50": "#3d85c6", "e2e_p95": "#e69138", "e2e_p99": "#cc0000", "ttft_p50": "#66707a"}
#: inter-token gaps are the decode bucket's
DECODE = COLORS["decode"]
#: Steps of a round axis top (times a power of ten).
_NICE_STEPS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _nice_top(v: float) -> float:
    """Gives the round figure at or above `v` that a y axis ends on (6,814 ms → 8,000 ms)."""
    if v <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(v))
    return next(step * power for step in _NICE_STEPS if step * power >= v * (1 - 1e-9))


#: The latency-over-time lines, drawn in this order (later on top), each with its own dash so
#: that two lines on the same values stay apart: p95 dashed over p99 shows p99 between its dashes.
_LINES = (
    ("ttft_p50", "TTFT p50", "2 3"),
    ("e2e_p99", "e2e p99", None),
    ("e2e_p95", "e2e p95", "7 4"),
    ("e2e_p50", "e2e p50", None),
)
#: Steps between the time axis's inner ticks, in seconds.
_TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _runs(pts: list[dict[str, Any]], key: str, slice_ns: int | None) -> list[list[dict[str, Any]]]:
    """Gives the stretches of `pts` a line joins for series `key`: a slice with no requests
    (no point) or without the value ends one, so an idle stretch is a gap, not a slope."""
    runs: list[list[dict[str, Any]]] = []
    prev: dict[str, Any] | None = None
    for p in pts:
        if p.get(key) is None:
            prev = None
            continue
        if prev is None or (slice_ns and p["start_ns"] - prev["start_ns"] > slice_ns):
            runs.append([])
        runs[-1].append(p)
        prev = p
    return runs


def _clock(ns: int, with_date: bool) -> str:
    t = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")


def _time_axis(t0: int, t1: int, x: Any) -> list[str]:
    """Gives the time axis's labels (UTC): the first slice's start with its date at the left, the
    last one's at the right (its date too when another day), round times between."""
    base = H - PAD
    same_day = _clock(t0, True)[:10] == _clock(t1, True)[:10]
    parts = [
        f'<text class="x-label" x="{x(t0):.1f}" y="{base + 14}" font-size="10" text-anchor="start">{_e(_clock(t0, True))} UTC</text>',
        f'<text class="x-label" x="{x(t1):.1f}" y="{base + 14}" font-size="10" text-anchor="end">{_e(_clock(t1, not same_day))} UTC</text>',
    ]
    span_s = (t1 - t0) / 1e9
    step = next((s for s in _TICK_STEPS_S if span_s / s <= 6), _TICK_STEPS_S[-1])
    tick = (t0 // (step * 10**9) + 1) * step * 10**9
    while tick < t1:
        tx = x(tick)
        # clear of the end labels (about 6 px a character at 10 px) and of its own half width
        if tx - x(t0) > 6 * (len(_clock(t0, True)) + 4) + 30 and x(t1) - tx > 6 * (len(_clock(t1, not same_day)) + 4) + 30:
            parts.append(f'<line x1="{tx:.1f}" y1="{base}" x2="{tx:.1f}" y2="{base + 4}" stroke="#999"/>')
            parts.append(f'<text class="x-label" x="{tx:.1f}" y="{base + 14}" font-size="10" text-anchor="middle">{_e(_clock(tick, False))}</text>')
        tick += step * 10**9
    return parts


def _timeline_svg(timeline: dict[str, Any]) -> str:
    pts = timeline.get("points") or []
    if len(pts) < 2:
        return "<p>Not enough time slices for a chart.</p>"
    slice_ns = timeline.get("slice_ns")
    t0, t1 = pts[0]["start_ns"], pts[-1]["start_ns"]
    top = _nice_top(max((p[s] or 0) for p in pts for s, _, _ in _LINES))
    def x(t: int) -> float:
        return LEFT + (W - LEFT - PAD) * (t - t0) / max(t1 - t0, 1)
    def y(v: float) -> float:
        return H - PAD - (H - 2 * PAD) * v / top
    parts = [f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="latency percentiles over time">']
    # y labels end left of the axis, with room for the longest ("999.9 ms"): none is cut off
    for v in (top, top / 2):
        parts.append(f'<line x1="{LEFT}" y1="{y(v):.1f}" x2="{W - PAD}" y2="{y(v):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(v) + 3:.1f}" text-anchor="end" font-size="10">{_e(_ms(v))}</text>')
    parts.append(f'<text x="{LEFT - 6}" y="{H - PAD + 3}" text-anchor="end" font-size="10">0</text>')
    parts.append(f'<line x1="{LEFT}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#999"/>')
    parts.append(f'<line x1="{LEFT}" y1="{PAD}" x2="{LEFT}" y2="{H - PAD}" stroke="#999"/>')
    parts += _time_axis(t0, t1, x)
    if slice_ns:
        secs = slice_ns / 1e9
        width = f"{secs / 60:g} min" if secs >= 60 and secs % 60 == 0 else f"{secs:g} s"
        note = f"one point per {width} slice; a gap: no requests"
        parts.append(f'<text x="{W - PAD}" y="{PAD - 26}" font-size="10" fill="#666" text-anchor="end">{_e(note)}</text>')
    # the legend, in reading order (p50, p95, p99, TTFT), each with its line's dash
    legend = sorted(_LINES, key=lambda line: ("e2e_p50", "e2e_p95", "e2e_p99", "ttft_p50").index(line[0]))
    for i, (s, label, dash) in enumerate(legend):
        lx = LEFT + 8 + i * 100
        style = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<line x1="{lx}" y1="{PAD - 14}" x2="{lx + 22}" y2="{PAD - 14}" stroke="{COLORS[s]}" stroke-width="2"{style}/>')
        parts.append(f'<text x="{lx + 26}" y="{PAD - 10}" font-size="11" fill="{COLORS[s]}">{_e(label)}</text>')
    for s, _, dash in _LINES:
        style = f' stroke-dasharray="{dash}"' if dash else ""
        for run in _runs(pts, s, slice_ns):
            if len(run) == 1:  # a slice alone between gaps: a dot
                p = run[0]
                parts.append(f'<circle data-series="{s}" cx="{x(p["start_ns"]):.1f}" cy="{y(p[s]):.1f}" r="2.5" fill="{COLORS[s]}"/>')
                continue
            line = " ".join(f"{x(p['start_ns']):.1f},{y(p[s]):.1f}" for p in run)
            parts.append(f'<polyline data-series="{s}" fill="none" stroke="{COLORS[s]}" stroke-width="{2 if dash else 1.5}"{style} points="{line}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _buckets_svg(buckets: dict[str, Any]) -> str:
    parts = [f'<svg viewBox="0 0 {W} 60" width="{W}" height="60" role="img" aria-label="bucket shares">']
    xpos = float(PAD)
    span = W - 2 * PAD
    for b in BUCKETS:
        share = buckets[b].get("share") or 0.0
        w = span * share
        if w > 0:
            parts.append(f'<rect x="{xpos:.1f}" y="8" width="{w:.1f}" height="24" fill="{COLORS[b]}"><title>{_e(b)} {share * 100:.1f} %</title></rect>')
            if w > 60:
                parts.append(f'<text x="{xpos + 4:.1f}" y="24" font-size="11" fill="#fff">{_e(b)} {share * 100:.0f} %</text>')
        xpos += w
    legend = "".join(
        f'<rect x="{PAD + i * 120}" y="42" width="10" height="10" fill="{COLORS[b]}"/>'
        f'<text x="{PAD + 14 + i * 120}" y="51" font-size="11">{_e(b)} {(buckets[b].get("share") or 0) * 100:.1f} %</text>'
        for i, b in enumerate(BUCKETS)
    )
    return "".join(parts) + legend + "</svg>"


def _legend(lines: list[list[tuple[str, str]]]) -> str:
    """Gives the names a table shows with what they mean (`render.legend`), a line each."""
    return "".join(
        '<p class="note legend">' + "; ".join(f"<b>{_e(name)}</b>: {_e(meaning)}" for name, meaning in line) + "</p>"
        for line in lines
    )


def _examples(finding: dict[str, Any], explorer: str | None = None) -> str:
    """Gives a finding's example traces, or says it has none kept (and what keeps more);
    with `explorer` (the URL of the server the report came from) each links to its page."""
    shown = (finding.get("example_traces") or [])[:EXAMPLES_SHOWN]
    if explorer:
        base = explorer.rstrip("/")
        examples = ", ".join(
            f'<a href="{_e(base)}/trace/{_e(quote(str(t), safe=""))}"><code>{_e(t)}</code></a>' for t in shown
        )
    else:
        examples = ", ".join(f"<code>{_e(t)}</code>" for t in shown)
    if examples:
        return f"<p>Example traces: {examples}</p>"
    if shows_no_examples(finding):
        codes = {k: f"<code>{_e(v)}</code>" for k, v in KEEP_MORE_OPTIONS.items()}
        return f"<p>Example traces: {_e(NO_EXAMPLES).format(**codes)}</p>"
    return ""


def _buckets_table(report: dict[str, Any]) -> str:
    """Gives each bucket's share with its p50 and p99 (as the text and markdown reports), and
    the queue's parts (`queue_wait`, `tokenize`, `other`: their shares of the queue's time)."""
    buckets = report["buckets"]
    rows = ["<table><tr><th>bucket</th><th>share</th><th>p50</th><th>p99</th></tr>"]
    for b in BUCKETS:
        bucket = buckets[b]
        name = f'<span class="sw" style="background:{COLORS[b]}"></span>{_e(b)}'
        if b == "network" and not bucket.get("measured"):
            rows.append(f"<tr><th>{name}</th><td>not measured</td><td>—</td><td>—</td></tr>")
            continue
        share = "—" if bucket.get("share") is None else f"{bucket['share'] * 100:.1f} %"
        rows.append(
            f"<tr><th>{name}</th><td>{_e(share)}</td><td>{_e(_ms(bucket.get('p50')))}</td>"
            f"<td>{_e(_ms(bucket.get('p99')))}</td></tr>"
        )
    rows.append("</table>")
    parts = queue_parts_line(report)
    if parts:
        rows.append(f'<p class="parts">{_e(parts)} <small>(shares of the queue\'s time)</small></p>')
    return "".join(rows)


def _itl_svg(hist: list[dict[str, Any]]) -> str:
    if not hist:
        return "<p>No inter-token gaps recorded.</p>"
    top = max(h["count"] for h in hist) or 1
    n = len(hist)
    bw = (W - 2 * PAD) / n
    parts = [f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="inter-token gap distribution">']
    for i, h in enumerate(hist):
        bh = (H - 2 * PAD) * math.log1p(h["count"]) / math.log1p(top)
        label = "∞" if h["le_ms"] is None else _ms(h["le_ms"])
        parts.append(
            f'<rect x="{PAD + i * bw:.1f}" y="{H - PAD - bh:.1f}" width="{max(bw - 1, 1):.1f}" height="{bh:.1f}" fill="{DECODE}">'
            f'<title>≤ {_e(label)}: {_e(h["count"])} gaps</title></rect>'
        )
    first = hist[0]["le_ms"]
    last = hist[-1]["le_ms"]
    parts.append(f'<text x="{PAD}" y="{H - PAD + 14}" font-size="10">≤ {_e(_ms(first))}</text>')
    parts.append(f'<text x="{W - PAD}" y="{H - PAD + 14}" font-size="10" text-anchor="end">≤ {_e("∞" if last is None else _ms(last))}</text>')
    parts.append(f'<text x="{PAD}" y="{PAD - 10}" font-size="11">gaps per bucket (log scale)</text>')
    parts.append("</svg>")
    return "".join(parts)


def _coverage(report: dict[str, Any]) -> str:
    """Gives the coverage section: the signals, the complaints not checkable and what to add,
    the traces of no known convention (empty for a report without one)."""
    if not cov.has_coverage(report):
        return ""
    parts = [f"<h2>{_e(cov.TITLE)}</h2>", f'<p class="note">{_e(cov.WHAT)}</p>']
    signals = cov.signals_line(report)
    parts += [f"<p>{_e(signals)}</p>"] if signals else []
    checked = cov.checked(report)
    if checked:
        parts.append("<p>checked: " + ", ".join(f"<code>{_e(c)}</code>" for c in checked) + "</p>")
    missing = cov.unchecked(report)
    if missing:
        items = "".join(f"<li><code>{_e(c)}</code>: {_e(why)}</li>" for c, why in missing)
        parts.append(f'<p>not checkable:</p><ul class="unchecked">{items}</ul>')
    unmatched = cov.unmatched_line(report)
    parts += [f'<p class="unmatched">{_e(unmatched)}</p>'] if unmatched else []
    return "".join(parts)


def render_html(report: dict[str, Any], explorer: str | None = None) -> str:
    """Gives the report as one self-contained HTML page with inline SVG charts; with
    `explorer` (the server's URL, `report --url`) its example traces link to their pages."""
    req = report["requests"]
    rows = []
    for key, label in (("e2e", "end-to-end"), ("ttft", "TTFT"), ("ttft_client", "TTFT (user)"),
                       ("tpot", "TPOT"), ("itl", "ITL")):
        row = report["latency"][key]
        if all(v is None for v in row.values()):
            continue
        rows.append(f"<tr><th>{_e(label)}</th>" + "".join(f"<td>{_e(latency_cell(report, key, p))}</td>" for p in PERCENTILES) + "</tr>")
    findings = []
    if report.get("findings"):
        mixed = mixed_services_note(report)
        findings.append(f'<p class="note">{_e(FINDINGS_ORDER)}</p>')
        if mixed:
            option = _e("--service NAME")
            findings.append(f'<p class="note">{_e(mixed).replace(option, f"<code>{option}</code>")}</p>')
    for f in report.get("findings") or []:
        evidence = "".join(f"<li>{_e(e.get('text', '') if isinstance(e, dict) else e)}</li>" for e in f.get("evidence", []))
        findings.append(
            f'<section class="finding"><h3>{_e(f["title"])} <small>{_e(f["complaint"])} · confidence '
            f"{_e(format_confidence(f['confidence']))}</small></h3><ul>{evidence}</ul>"
            f'<p><b>Fix first:</b> {_e(f["fix_first"])}</p>'
            + _examples(f, explorer)
            + "</section>"
        )
    body = [
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>tokentrace report</title>",
        "<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:800px;color:#222}"
        "table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #eee}"
        "th{text-align:left}.finding{border-left:4px solid #d79b00;padding-left:1em;margin:1em 0}"
        "small,.note{color:#666;font-weight:normal}"
        ".sw{display:inline-block;width:10px;height:10px;margin-right:5px;border-radius:2px}.parts,.legend{margin:.4em 0}</style></head><body>",
        "<h1>tokentrace report</h1>",
        f"<p><small>{_e(describe_window(report))}</small></p>",
        f"<p><b>{req['count']:,}</b> {noun(req['count'], 'request')} · {_e(counted(req['kept_traces'], 'kept trace'))} · "
        f"{_e(counted(req['errors'], 'error'))}</p>",
    ]
    if req["count"]:
        terms = legend(report)
        body += [
            "<h2>Diagnosis</h2>",
            "".join(findings) or "<p>No latency complaint stands out in this window.</p>",
            _coverage(report),
            "<h2>Latency</h2><table><tr><th></th>" + "".join(f"<th>{_e(p)}</th>" for p in PERCENTILES) + "</tr>",
            "".join(rows) + "</table>",
            _legend(terms["latency"]),
            "<h2>Latency over time</h2>", _timeline_svg(report.get("timeline") or {}),
            "<h2>Where the time goes</h2>", _buckets_svg(report["buckets"]), _buckets_table(report),
            *(f"<p>{_e(note)}</p>" for note in coverage_notes(report)),
            _legend(terms["buckets"] + terms["requests"]),
            "<h2>Inter-token gaps</h2>", _itl_svg(report.get("itl_histogram") or []),
        ]
    else:
        body.append(f"<p>{_e(no_requests_message(report))}</p>")
        unmatched = cov.unmatched_line(report)
        body += [f'<p class="unmatched">{_e(unmatched)}</p>'] if unmatched else []
    body.append("</body></html>\n")
    return "\n".join(body)
