"""Renderers of the report data: text for terminals, JSON for tools."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from tokentrace._words import counted, noun
from tokentrace.analyzer import render_coverage as cov
from tokentrace.analyzer.diagnosis._base import MAX_EXAMPLES
from tokentrace.analyzer.report import BUCKETS, PERCENTILES

#: What a terminal would act on rather than show: C0 and C1 controls (escape sequences
#: can forge links, erase lines, set the title; a newline forges a report line), DEL,
#: the Unicode line separators and the bidirectional overrides that reorder text.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """Gives `text` (a value that came from spans: a tenant, an environment, a service)
    with every character a terminal would act on written out as `\\xNN` / `\\uNNNN`."""
    return _UNPRINTABLE.sub(_shown, str(text))


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
            parts.append(f"{key.replace('_', '-')} {printable(value)}")
    return " · ".join(parts)


#: Where `tokentrace serve` takes OTLP unless told otherwise (collector/settings.py's defaults).
DEFAULT_OTLP_HTTP = "http://127.0.0.1:4318"
DEFAULT_OTLP_GRPC = "127.0.0.1:4317"


def no_requests_message(report: dict[str, Any]) -> str:
    """Says why a report is empty: nothing arrived yet (and where to send the spans), or
    the filters match nothing.

    An empty report read from a lake (`lake`: true) sends the reader to the shards.  A
    report from a server that says where it takes OTLP (`otlp`: `{"http": URL,
    "grpc": HOST:PORT}`, as the explorer's `otlp` global) quotes those addresses;
    otherwise `serve`'s defaults, named as such."""
    if (report.get("window") or {}).get("filters"):
        return f"No requests match {describe_window(report)}."
    if report.get("lake"):  # a lake's report (`report --lake`, a query node): no OTLP here
        return (
            "No requests in the lake yet: its shards (tokentrace serve --lake …) take the "
            "fleet's OTLP and move their rows in every few seconds."
        )
    otlp = report.get("otlp")
    said = otlp if isinstance(otlp, dict) else {}
    http, grpc = said.get("http"), said.get("grpc")
    if isinstance(http, str) and http:
        where = f"OTLP/HTTP on {printable(http)}"
        if isinstance(grpc, str) and grpc:
            where += f", OTLP/gRPC on {printable(grpc)}"
    else:
        where = (
            f"by default tokentrace serve takes OTLP/HTTP on {DEFAULT_OTLP_HTTP}, "
            f"OTLP/gRPC on {DEFAULT_OTLP_GRPC}"
        )
    return f"No requests in this window yet: point your server's OTLP exporter at the collector ({where})."


def format_ms(v: float | None) -> str:
    """Gives a millisecond figure as every report format writes it: '—' when not measured,
    '912.4 ms', and seconds with one decimal more from 1 s on ('1.00 s', '6.81 s').

    The switch is decided on the rounded figure, so 999.96 ms reads '1.00 s', not
    '1000.0 ms'; the explorer (`web/_format.py` `ms`) writes durations the same way.
    """
    if v is None:
        return "—"
    return f"{v / 1000:.2f} s" if abs(round(v, 1)) >= 1000 else f"{v:.1f} ms"


_ms = format_ms


def approximate(report: dict[str, Any], key: str) -> list[str]:
    """Gives which percentiles of latency row `key` the report estimated rather than
    computed exactly (`latency.approximate`; a report from an older server says none)."""
    said = (report.get("latency") or {}).get("approximate")
    marked = said.get(key) if isinstance(said, dict) else None
    return [str(p) for p in marked] if isinstance(marked, list) else []


def latency_cell(report: dict[str, Any], key: str, p: str) -> str:
    """Gives one figure of the latency table, `≈` before it where it is estimated."""
    figure = format_ms(report["latency"][key][p])
    return f"≈ {figure}" if figure != "—" and p in approximate(report, key) else figure


def format_confidence(c: float | None) -> str:
    """Gives a finding's 0..1 confidence as a whole percent with a space: '72 %'."""
    return "—" if c is None else f"{float(c) * 100:.0f} %"


#: How `diagnose` ranks the findings (`Finding.score` in analyzer/diagnosis/_base.py), in words.
FINDINGS_ORDER = (
    "Most important first: each finding's confidence, weighted by the share of the "
    "window's end-to-end time it touches."
)


def mixed_services_note(report: dict[str, Any], option: str = "--service NAME") -> str | None:
    """Says that the findings mix several services, when the report is not for one service
    (`requests.services` counts them; a report from an older server has no count: no note)."""
    try:
        services = int((report.get("requests") or {}).get("services") or 0)
    except (TypeError, ValueError):
        return None
    if services <= 1 or ((report.get("window") or {}).get("filters") or {}).get("service"):
        return None
    return f"These findings mix {services} services: {option} picks one."


def network_unmeasured(report: dict[str, Any]) -> str | None:
    """Says why network is not measured (None when it is): no client spans, or client
    spans only (the server was not seen).  Reports from an older server: no client spans."""
    if (report.get("buckets") or {}).get("network", {}).get("measured"):
        return None
    req = report.get("requests") or {}
    if req.get("count") and req.get("server_unseen") == req.get("count"):
        return "client spans only: instrument the server to split the wait for the first token"
    return "no client spans: instrument the client"


def server_unseen_note(report: dict[str, Any]) -> str | None:
    """Says how many requests were seen only by their client, whose whole wait for the
    first token is counted as prefill (it cannot be split into network, queue and prefill)."""
    req = report.get("requests") or {}
    unseen, count = int(req.get("server_unseen") or 0), int(req.get("count") or 0)
    if not unseen:
        return None
    who = "Every request was" if unseen == count else f"{unseen:,} of {count:,} requests were"
    return (
        f"{who} seen only by the client (no server spans): the whole wait for the first "
        "token counts as prefill, network and queue not split."
    )


def coverage_notes(report: dict[str, Any]) -> list[str]:
    """Gives the sentences that say what the window's spans could not measure."""
    why = network_unmeasured(report) if (report.get("requests") or {}).get("count") else None
    unseen = server_unseen_note(report)
    return [*([f"Network not measured: {why}."] if why else []), *([unseen] if unseen else [])]


#: What the report's names mean, said under the table that shows them (`legend`).
LATENCY_TERMS = {
    "ttft": ("TTFT", "time to first token as the server saw it: queue, then prefill"),
    "ttft_client": ("TTFT (user)", "as the client saw it, network included"),
    "tpot": ("TPOT", "time per output token after the first"),
    "itl": ("ITL", "gap between consecutive tokens"),
}
#: Said after ITL's meaning where its figures are estimated (report.py `itl_percentiles`).
ITL_APPROXIMATE = "≈: estimated from per-request histograms, within 12 %"
BUCKET_TERMS = {
    "queue": ("queue", "the server's time outside compute (waits, tokenizing, overhead)"),
    "prefill": ("prefill", "the compute part of TTFT"),
    "decode": ("decode", "first token to last"),
}
QUEUE_PART_TERMS = {
    # vLLM's time_in_queue is its engine core's queue alone: a request held while the engine
    # core runs another's long prefill reads 0 there, its wait in `other` (issue 22)
    "queue_wait": ("queue_wait", "measured scheduler wait (vLLM: its engine core's queue only)"),
    "tokenize": ("tokenize", "measured tokenization"),
    "other": (
        "other",
        "the rest of the queue (vLLM: the wait before its engine core takes the request in, "
        "such as behind another request's step)",
    ),
}
KEPT_TRACES_TERM = (
    "kept traces",
    "requests whose whole span tree was kept (slow, broken, or the baseline sample); "
    "the rest keep a summary row",
)


def _measured(row: dict[str, Any] | None) -> bool:
    return any(v is not None for v in (row or {}).values())


def queue_parts_shown(report: dict[str, Any]) -> bool:
    """Whether the queue's parts are measured in this window (every format's `queue =` line)."""
    queue = (report.get("buckets") or {}).get("queue") or {}
    return any((queue.get("parts") or {}).values())


def queue_parts_line(report: dict[str, Any]) -> str | None:
    """Gives the queue's parts as every format writes them under the buckets, each part's
    share of the queue's time ('queue = queue_wait 99.9 %, tokenize 0.0 %, other 0.1 %');
    None where they are not measured."""
    if not queue_parts_shown(report):
        return None
    parts = report["buckets"]["queue"]["parts"]
    return "queue = " + ", ".join(f"{k} {(v or 0) * 100:.1f} %" for k, v in parts.items())


#: Example traces a finding shows, in every format: all that the JSON holds for it.
EXAMPLES_SHOWN = MAX_EXAMPLES
#: Said for a finding with no example trace: none of its requests' span trees was kept
#: (`{keep_rules}`, `{baseline}`: the options, written as each format writes code).
NO_EXAMPLES = (
    "none kept (the spans of these requests were sampled out; {keep_rules} or a higher "
    "{baseline} keeps more)"
)
KEEP_MORE_OPTIONS = {"keep_rules": "tokentrace serve --keep-rules", "baseline": "--baseline"}


def shows_no_examples(finding: dict[str, Any]) -> bool:
    """Whether a finding says it has no example trace: it has the list, and it is empty (a
    report from an older server without the list says nothing)."""
    examples = finding.get("example_traces")
    return isinstance(examples, list) and not examples


def legend(report: dict[str, Any]) -> dict[str, list[list[tuple[str, str]]]]:
    """Gives the names to explain under each table, for the rows the report shows: per
    table (`latency`, `buckets`, `requests`) its lines, each a list of (name, meaning)."""
    if not (report.get("requests") or {}).get("count"):
        return {"latency": [], "buckets": [], "requests": []}
    latency = report.get("latency") or {}
    terms = dict(LATENCY_TERMS)
    if approximate(report, "itl"):
        name, meaning = terms["itl"]
        terms["itl"] = (name, f"{meaning} ({ITL_APPROXIMATE})")
    lines = [
        [terms[k] for k in keys if _measured(latency.get(k))]
        for keys in (("ttft", "ttft_client"), ("tpot", "itl"))
    ]
    buckets = [list(BUCKET_TERMS.values())]
    if queue_parts_shown(report):
        buckets.append(list(QUEUE_PART_TERMS.values()))
    return {
        "latency": [line for line in lines if line],
        "buckets": buckets,
        "requests": [[KEPT_TRACES_TERM]],
    }


def _text_legend(lines: list[list[tuple[str, str]]]) -> list[str]:
    return ["  " + "; ".join(f"{name}: {meaning}" for name, meaning in line) for line in lines]


def _md_legend(lines: list[list[tuple[str, str]]]) -> list[str]:
    """Gives the legend as markdown lines, one paragraph (lines end in a hard break)."""
    said = ["; ".join(f"**{name}**: {_md_escape(meaning)}" for name, meaning in line) for line in lines]
    return [line + ("  " if i < len(said) - 1 else "") for i, line in enumerate(said)]


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str)


def render_text(report: dict[str, Any]) -> str:
    """Gives the report as plain text, readable at a glance in a terminal."""
    req = report["requests"]
    window = describe_window(report)
    lines = [
        "tokentrace report" + (f"  ({window})" if window else ""),
        f"requests: {req['count']:,}  (kept traces: {req['kept_traces']:,}, errors: {req['errors']:,})",
        "",
    ]
    if not req["count"]:
        lines.append(no_requests_message(report))
        unmatched = cov.unmatched_line(report)
        lines += ["", printable(unmatched)] if unmatched else []
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
        lines.append(f"{label:<12}" + "".join(f"{latency_cell(report, key, p):>11}" for p in PERCENTILES))
    terms = legend(report)
    lines += _text_legend(terms["latency"])
    lines += ["", "where the time goes (share of all end-to-end time)"]
    for b in BUCKETS:
        bucket = report["buckets"][b]
        if b == "network" and not bucket.get("measured"):
            lines.append(f"  {'network':<9} not measured ({network_unmeasured(report)})")
            continue
        share = bucket["share"]
        bar = "█" * round((share or 0) * 40)
        lines.append(
            f"  {b:<9} {(share or 0) * 100:5.1f} %  {bar:<40} p50 {format_ms(bucket['p50'])}, p99 {format_ms(bucket['p99'])}"
        )
    parts = queue_parts_line(report)
    lines += [f"            {parts}"] if parts else []
    unseen = server_unseen_note(report)
    lines += [f"  {unseen}"] if unseen else []
    lines += _text_legend(terms["buckets"]) + _text_legend(terms["requests"])
    findings = report.get("findings") or []
    lines += ["", "diagnosis"]
    if not findings:
        lines.append("  No latency complaint stands out in this window.")
    else:
        mixed = mixed_services_note(report)
        lines += [f"  {FINDINGS_ORDER}", *([f"  {mixed}"] if mixed else [])]
    for i, f in enumerate(findings, 1):
        lines.append(
            f"  {i}. [{printable(f['complaint'])}] {printable(f['title'])}"
            f"  (confidence {format_confidence(f['confidence'])})"
        )
        for ev in f.get("evidence", []):
            lines.append(f"       - {printable(ev if isinstance(ev, str) else ev.get('text', ev))}")
        lines.append(f"       fix first: {printable(f['fix_first'])}")
        if f.get("example_traces"):
            lines.append(f"       example traces: {printable(', '.join(f['example_traces'][:EXAMPLES_SHOWN]))}")
        elif shows_no_examples(f):
            lines.append(f"       example traces: {NO_EXAMPLES.format(**KEEP_MORE_OPTIONS)}")
    return "\n".join(lines + _text_coverage(report)) + "\n"


def _text_coverage(report: dict[str, Any]) -> list[str]:
    """Gives the coverage section of the text report (none for a report without one)."""
    head = ["", f"{cov.TITLE.lower()}: {cov.WHAT}"]
    return _coverage_lines(report, head, "  ", "    - ", printable, str)


def _coverage_lines(
    report: dict[str, Any],
    head: list[str],
    item: str,
    sub_item: str,
    sentence: Callable[[object], str],
    complaint_name: Callable[[object], str],
) -> list[str]:
    """Gives the coverage section, `head` first, in one format's marks (none for a report
    without one): each line starts `item`, each complaint not checkable `sub_item`;
    `sentence` and `complaint_name` escape what the report says for that format."""
    if not cov.has_coverage(report):
        return []
    lines = list(head)
    signals = cov.signals_line(report)
    lines += [f"{item}{sentence(signals)}"] if signals else []
    checked = cov.checked(report)
    lines += [f"{item}checked: " + ", ".join(complaint_name(c) for c in checked)] if checked else []
    missing = cov.unchecked(report)
    if missing:
        lines.append(f"{item}not checkable:")
        lines += [f"{sub_item}{complaint_name(c)}: {sentence(why)}" for c, why in missing]
    unmatched = cov.unmatched_line(report)
    lines += [f"{item}{sentence(unmatched)}"] if unmatched else []
    return lines


def _md_escape(text: object) -> str:
    """Escapes the characters markdown tables and emphasis would read (and, as in text,
    those a terminal would act on).  Not for code spans: see `_md_code`."""
    s = printable(text)
    for ch in ("\\", "|", "*", "_", "`", "<", ">", "[", "]"):
        s = s.replace(ch, "\\" + ch)
    return s


_BACKTICKS = re.compile("`+")


def _md_code(text: object) -> str:
    """Gives `text` as a markdown code span, which shows its content as it is: a backslash
    there is a backslash (`peak\\_hours` would show one), so nothing is escaped; the fence is
    one backtick longer than any run of backticks inside (CommonMark), with a space each side
    where the content starts or ends with a backtick or a space (one is stripped each side).
    Control characters are written out as in text (a newline cannot end the span).  For the
    findings' list, not tables: a table cell would read a pipe inside as its end."""
    s = printable(text)
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(s)), default=0) + 1)
    if not s or s[:1] in ("`", " ") or s[-1:] in ("`", " "):
        s = f" {s} "  # "``" would open a span, not hold an empty one
    return f"{fence}{s}{fence}"


def render_markdown(report: dict[str, Any]) -> str:
    """Gives the report as GitHub-flavoured markdown (tables, a list of findings)."""
    req = report["requests"]
    window = describe_window(report)
    out = [
        "# tokentrace report",
        "",
        *([f"_{_md_escape(window)}_", ""] if window else []),
        f"**{req['count']:,}** {noun(req['count'], 'request')}, {counted(req['kept_traces'], 'kept trace')}, "
        f"{counted(req['errors'], 'error')}.",
        "",
    ]
    if not req["count"]:
        out.append(_md_escape(no_requests_message(report)))
        unmatched = cov.unmatched_line(report)
        out += ["", _md_escape(unmatched)] if unmatched else []
        return "\n".join(out) + "\n"
    out += ["## Latency", "", "| | " + " | ".join(PERCENTILES) + " |", "|---|" + "---:|" * len(PERCENTILES)]
    for key, label in (("e2e", "end-to-end"), ("ttft", "TTFT"), ("ttft_client", "TTFT (user)"),
                       ("tpot", "TPOT"), ("itl", "ITL")):
        row = report["latency"][key]
        if all(v is None for v in row.values()):
            continue
        out.append(f"| {label} | " + " | ".join(latency_cell(report, key, p) for p in PERCENTILES) + " |")
    terms = legend(report)
    if terms["latency"]:
        out += ["", *_md_legend(terms["latency"])]
    out += ["", "## Where the time goes", "", "| bucket | share | p50 | p99 |", "|---|---:|---:|---:|"]
    for b in BUCKETS:
        bucket = report["buckets"][b]
        if b == "network" and not bucket.get("measured"):
            out.append("| network | not measured | | |")
            continue
        out.append(f"| {b} | {(bucket['share'] or 0) * 100:.1f} % | {format_ms(bucket['p50'])} | {format_ms(bucket['p99'])} |")
    parts = queue_parts_line(report)
    out += ["", _md_escape(parts)] if parts else []
    for note in coverage_notes(report):
        out += ["", _md_escape(note)]
    out += ["", *_md_legend(terms["buckets"] + terms["requests"])]
    out += ["", "## Diagnosis", ""]
    findings = report.get("findings") or []
    if not findings:
        out.append("No latency complaint stands out in this window.")
    else:
        mixed = mixed_services_note(report, option="`--service NAME`")
        out += [_md_escape(FINDINGS_ORDER), *(["", mixed] if mixed else []), ""]
    for i, f in enumerate(findings, 1):
        out.append(
            f"{i}. **{_md_escape(f['title'])}** ({_md_code(f['complaint'])}, "
            f"confidence {format_confidence(f['confidence'])})"
        )
        for e in f.get("evidence", []):
            out.append(f"   - {_md_escape(e.get('text', e) if isinstance(e, dict) else e)}")
        out.append(f"   - *Fix first:* {_md_escape(f['fix_first'])}")
        if f.get("example_traces"):
            out.append("   - Example traces: " + ", ".join(_md_code(t) for t in f["example_traces"][:EXAMPLES_SHOWN]))
        elif shows_no_examples(f):
            codes = {k: _md_code(v) for k, v in KEEP_MORE_OPTIONS.items()}
            out.append("   - Example traces: " + NO_EXAMPLES.format(**codes))
    return "\n".join(out + _md_coverage(report)) + "\n"


def _md_coverage(report: dict[str, Any]) -> list[str]:
    """Gives the coverage section of the markdown report (none for a report without one)."""
    head = ["", f"## {cov.TITLE}", "", f"_{_md_escape(cov.WHAT)}_", ""]
    return _coverage_lines(report, head, "- ", "  - ", _md_escape, _md_code)

