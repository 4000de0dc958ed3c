"""Renderers of the report data: text for terminals, JSON for tools."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from tokentrace.analyzer.report import BUCKETS, PERCENTILES


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def describe_window(report: dict[str, Any]) -> str:
    """Gives what the report looks at in one line: its requests' time range and its filters."""
    window = report.get("window") or {}
    parts = []
    if window.get("start_ns") is not None and window.get("end_ns") is not None:
        parts.append(f"requests started {_when(window['start_ns'])} → {_when(window['end_ns'])}")
    for key, value in (window.get("filters") or {}).items():
        if key in ("start_ns", "end_ns"):
            parts.append(f"{'since' if key == 'start_ns' else 'until'} {_when(value)}")
        else:
            parts.append(f"{key.replace('_', '-')} {value}")
    return " · ".join(parts)


def no_requests_message(report: dict[str, Any]) -> str:
    """Says why a report is empty: nothing arrived yet, or the filters match nothing."""
    if (report.get("window") or {}).get("filters"):
        return f"No requests match {describe_window(report)}."
    return "No requests in this window yet: point your server's OTLP exporter at the collector."


def _ms(v: float | None) -> str:
    if v is None:
        return "—"
    # seconds from 1 s on, as the findings' evidence and the explorer write them
    return f"{v / 1000:.2f} s" if round(v, 1) >= 1000 else f"{v:.1f} ms"


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str)


def render_text(report: dict[str, Any]) -> str:
    """Gives the report as plain text, readable at a glance in a terminal."""
    req = report["requests"]
    window = describe_window(report)
    lines = [
        "tokentrace report" + (f"  ({window})" if window else ""),
        f"requests: {req['count']}  (kept traces: {req['kept_traces']}, errors: {req['errors']})",
        "",
    ]
    if not req["count"]:
        lines.append(no_requests_message(report))
        return "\n".join(lines) + "\n"
    lines.append(f"{'latency':<12}" + "".join(f"{p:>11}" for p in PERCENTILES))
    labels = {
        "e2e": "end-to-end",
        "ttft": "TTFT",
        "ttft_client": "TTFT (user)",
        "tpot": "TPOT",
        "itl": "ITL",
    }
    for key, label in labels.items():
        row = report["latency"][key]
        if all(v is None for v in row.values()):
            continue
        lines.append(f"{label:<12}" + "".join(f"{_ms(row[p]):>11}" for p in PERCENTILES))
    lines += ["", "where the time goes (share of all end-to-end time)"]
    for b in BUCKETS:
        bucket = report["buckets"][b]
        if b == "network" and not bucket.get("measured"):
            lines.append(f"  {'network':<9} not measured (no client spans: instrument the client)")
            continue
        share = bucket["share"]
        bar = "█" * round((share or 0) * 40)
        lines.append(
            f"  {b:<9} {(share or 0) * 100:5.1f} %  {bar:<40} p50 {_ms(bucket['p50'])}, p99 {_ms(bucket['p99'])}"
        )
    parts = report["buckets"]["queue"].get("parts") or {}
    if any(parts.values()):
        lines.append(
            "            queue = "
            + ", ".join(f"{k} {(v or 0) * 100:.0f} %" for k, v in parts.items())
        )
    findings = report.get("findings") or []
    lines += ["", "diagnosis"]
    if not findings:
        lines.append("  No latency complaint stands out in this window.")
    for i, f in enumerate(findings, 1):
        lines.append(f"  {i}. [{f['complaint']}] {f['title']}  (confidence {f['confidence']:.0%})")
        for ev in f.get("evidence", []):
            lines.append(f"       - {ev if isinstance(ev, str) else ev.get('text', ev)}")
        lines.append(f"       fix first: {f['fix_first']}")
        if f.get("example_traces"):
            lines.append(f"       example traces: {', '.join(f['example_traces'][:3])}")
    return "\n".join(lines) + "\n"


def _md_escape(text: object) -> str:
    """Escapes the characters markdown tables and emphasis would read."""
    s = str(text)
    for ch in ("\\", "|", "*", "_", "`", "<", ">", "[", "]"):
        s = s.replace(ch, "\\" + ch)
    return s


def render_markdown(report: dict[str, Any]) -> str:
    """Gives the report as GitHub-flavoured markdown (tables, a list of findings)."""
    req = report["requests"]
    window = describe_window(report)
    out = [
        "# tokentrace report",
        "",
        *([f"_{_md_escape(window)}_", ""] if window else []),
        f"**{req['count']}** requests, {req['kept_traces']} kept traces, {req['errors']} errors.",
        "",
    ]
    if not req["count"]:
        out.append(_md_escape(no_requests_message(report)))
        return "\n".join(out) + "\n"
    out += ["## Latency", "", "| | " + " | ".join(PERCENTILES) + " |", "|---|" + "---:|" * len(PERCENTILES)]
    for key, label in (("e2e", "end-to-end"), ("ttft", "TTFT"), ("ttft_client", "TTFT (user)"),
                       ("tpot", "TPOT"), ("itl", "ITL")):
        row = report["latency"][key]
        if all(v is None for v in row.values()):
            continue
        out.append(f"| {label} | " + " | ".join(_ms(row[p]) for p in PERCENTILES) + " |")
    out += ["", "## Where the time goes", "", "| bucket | share | p50 | p99 |", "|---|---:|---:|---:|"]
    for b in BUCKETS:
        bucket = report["buckets"][b]
        if b == "network" and not bucket.get("measured"):
            out.append("| network | not measured | | |")
            continue
        out.append(f"| {b} | {(bucket['share'] or 0) * 100:.1f} % | {_ms(bucket['p50'])} | {_ms(bucket['p99'])} |")
    out += ["", "## Diagnosis", ""]
    findings = report.get("findings") or []
    if not findings:
        out.append("No latency complaint stands out in this window.")
    for i, f in enumerate(findings, 1):
        out.append(f"{i}. **{_md_escape(f['title'])}** (`{_md_escape(f['complaint'])}`, confidence {f['confidence']:.0%})")
        for e in f.get("evidence", []):
            out.append(f"   - {_md_escape(e.get('text', e) if isinstance(e, dict) else e)}")
        out.append(f"   - *Fix first:* {_md_escape(f['fix_first'])}")
        if f.get("example_traces"):
            out.append("   - Example traces: " + ", ".join(f"`{_md_escape(t)}`" for t in f["example_traces"][:5]))
    return "\n".join(out) + "\n"
