"""The trace view's data: span waterfall, each request's buckets, token timeline, shared steps."""

from __future__ import annotations

import json
from typing import Any

import duckdb

from tokentrace.analyzer.conventions import UNMEASURED_PARTS
from tokentrace.analyzer.conventions.genai_client import is_llm_client
from tokentrace.analyzer.spans import KIND_CLIENT
from tokentrace.analyzer.summary import TOKEN_TIMES_CLIENT, TOKEN_TIMES_SERVER
from tokentrace.instrumentation import semconv as sc
from tokentrace.store import reasons
from tokentrace.web import queries
from tokentrace.web._db import fetch_dicts, time_limit
from tokentrace.web._long_values import bounded_attributes
from tokentrace.web._params import ParamError
from tokentrace.web._reads import SideBySide, side_by_side
from tokentrace.web._timeline import as_span, build_timeline, client_chunk_times_ns, token_times_ns

#: Most spans one trace view loads; a bigger trace shows its first SPAN_CAP and says so.
SPAN_CAP = 5000
#: Most requests one trace may hold (batches) before the view truncates.
REQUEST_CAP = 100
#: Most requests a request's "shared engine steps" list shows.
SHARED_CAP = 200
KIND_NAMES = {
    0: "unspecified",
    1: "internal",
    2: "server",
    3: "client",
    4: "producer",
    5: "consumer",
}
STATUS_NAMES = {0: "unset", 1: "ok", 2: "error"}


#: The bucket (and queue part) each of tokentrace's phase spans measures, so the waterfall draws
#: it in that bucket's colour, as the request's bucket bar above it (docs/buckets.md: the
#: scheduler's wait is `queue_wait`, tokenizing `tokenize`, post-processing the rest, `other`).
PHASE_BUCKETS: dict[str, tuple[str, str]] = {
    sc.SPAN_TOKENIZE: ("queue", "tokenize"),
    sc.SPAN_QUEUE: ("queue", "queue_wait"),
    sc.SPAN_PREFILL: ("prefill", "prefill"),
    sc.SPAN_DECODE: ("decode", "decode"),
    sc.SPAN_DETOKENIZE: ("queue", "other"),
}

#: What each measure a p99 reason watches is called in words (`reasons.P99_MEASURES`).
_MEASURE_WORDS = {
    "ttft_ms": "TTFT (server)", "e2e_ms": "E2E", "queue_ms": "queue time", "prefill_ms": "prefill time",
    "decode_ms": "decode time", "network_ms": "network time", "itl_max_ms": "largest inter-token gap",
}  # fmt: skip
#: The reason of a trace kept whole because the analyzer failed on it.
UNSUMMARIZED = reasons.REASON_UNSUMMARIZED
#: Why the collector kept a trace's spans, in words, by its sampling reason (docs/collector.md).
KEPT_REASONS: dict[str, str] = {
    reasons.REASON_ERROR: "a span had status ERROR, or the request was an error",
    reasons.REASON_SLO: "its TTFT, E2E or largest inter-token gap was above a configured SLO",
    **{
        reason: f"its {_MEASURE_WORDS.get(measure, measure)} was above the running p99 of its service, model and route"
        for measure, reason in reasons.P99_MEASURES
    },
    reasons.REASON_RULE: "a --keep-rules attribute matched",
    reasons.REASON_P99_WARMUP: "one of its service, model and route's first requests, before there is a p99 to judge it by",
    reasons.REASON_BASELINE: "picked at random by the baseline sample",
    UNSUMMARIZED: "the analyzer could not summarize it, so its spans were kept to look at",
    reasons.REASON_ENGINE_START: "it is an engine's start-up (loading the model, allocating the KV cache): "
    "the cold-start evidence, kept whole",
}
#: What a kept trace's weight is (the adjusted count of tail sampling), said after the reason.
KEPT_WEIGHT = "Its weight is how many requests it stands for: 1 / the chance it had of being kept."


def kept_why(reason: str) -> str:
    """Gives why the collector kept a trace's whole span tree and what its weight means, in words."""
    said = KEPT_REASONS.get(reason)
    why = (
        f"Spans kept whole ({reason}): {said}." if said else f"Spans kept whole (reason {reason})."
    )
    return f"{why} {KEPT_WEIGHT}"


#: How long before a request's start an engine step may have begun and still overlap it: a
#: scheduler step lasts milliseconds, so a minute is far beyond any.  Without a lower bound on
#: `start_ns` the steps' query read every step before the request (1.1 s for a request in the
#: middle of six hours of 8.6 M steps), with it the few row groups around it.
STEP_LOOKBACK_NS = 60 * 10**9

#: Fewest hex digits the jump box takes as the start of a trace id (pages show the first 16).
MIN_PREFIX = 8


class TraceNotFound(LookupError):
    """No request summary and no span has this trace id (or, for an export, no kept span)."""


class SpansNotKept(TraceNotFound):
    """The trace's request summary is stored but its spans were sampled out (an export has none)."""


def kept_spans(cur: duckdb.DuckDBPyConnection, trace_id: str) -> list[dict[str, Any]]:
    """Gives the trace's stored spans for an export; raises SpansNotKept when its spans were
    sampled out (its request summary is stored), TraceNotFound when there is no such trace."""
    spans, _ = load_spans(cur, trace_id)
    if spans:
        return spans
    summary = cur.execute(
        "SELECT 1 FROM requests WHERE trace_id = ? LIMIT 1", [trace_id]
    ).fetchone()
    if summary is not None:
        raise SpansNotKept(
            f"no kept spans for trace id {trace_id}: its spans were sampled out "
            f"(its request summary is at /trace/{trace_id})"
        )
    raise TraceNotFound(f"no request or span with trace id {trace_id}")


def resolve_trace_prefix(cur: duckdb.DuckDBPyConnection, trace_id: str) -> str:
    """Gives the one trace id that starts with `trace_id` when it is a shorter prefix, else `trace_id`.

    Pages show trace ids cut to 16 digits; copied from there into the jump box,
    they must still lead to the trace (a full id, or one found no other way, is
    passed on unchanged, and the trace page says when there is no such trace).
    """
    if not MIN_PREFIX <= len(trace_id) < 32:
        return trace_id
    for table in ("requests", "spans"):  # spans too: a trace may have spans and no summary
        rows, more = fetch_dicts(
            cur,
            f"SELECT DISTINCT trace_id FROM {table} WHERE starts_with(trace_id, ?) ORDER BY trace_id = ? DESC LIMIT 2",  # noqa: S608 - fixed table names
            [trace_id, trace_id],
            cap=1,
        )
        if rows and (not more or rows[0]["trace_id"] == trace_id):
            return str(rows[0]["trace_id"])
        if more:
            raise ParamError(f"several traces start with {trace_id}; give more of its digits")
    return trace_id


def _json(text: str, default: Any) -> Any:
    try:
        return json.loads(text) if text else default
    except ValueError:
        return default


def load_spans(cur: duckdb.DuckDBPyConnection, trace_id: str) -> tuple[list[dict[str, Any]], bool]:
    """Gives the stored spans of a trace with their JSON columns parsed, and a truncated flag."""
    rows, truncated = fetch_dicts(
        cur,
        "SELECT * FROM spans WHERE trace_id = ? ORDER BY start_ns, span_id",
        [trace_id],
        cap=SPAN_CAP,
    )
    for row in rows:
        row["attributes"] = _json(row["attributes"], {})
        row["events"] = _json(row["events"], [])
        row["links"] = _json(row["links"], [])
        row["resource"] = _json(row["resource"], {})
    return rows, truncated


def waterfall(spans: list[dict[str, Any]], t0: int, t1: int, trace_id: str) -> list[dict[str, Any]]:
    """Gives the spans depth-first (children by start), each with depth and bar position in %;
    list attributes too long to carry whole are summarized (`_long_values.bounded_attributes`)."""
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict[str, Any]]] = {}
    roots = []
    for s in spans:
        parent = s["parent_span_id"]
        if parent and parent in ids and parent != s["span_id"]:
            children.setdefault(parent, []).append(s)
        else:  # roots, and orphans whose parent was not kept or not sent
            roots.append(s)
    total = max(1, t1 - t0)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    stack = [(s, 0, "") for s in reversed(roots)]
    while stack:
        span, depth, parent = stack.pop()
        if span["span_id"] in seen:  # a cycle in bad data must not hang the page
            continue
        seen.add(span["span_id"])
        kids = children.get(span["span_id"], [])
        phase = PHASE_BUCKETS.get(span["name"])
        out.append(
            {
                "span_id": span["span_id"],
                "parent_span_id": span["parent_span_id"],
                "parent_row": parent,
                "name": span["name"],
                "service": span["service_name"],
                "kind": KIND_NAMES.get(span["kind"], str(span["kind"])),
                # the bucket and queue part a phase span measures; None for every other span
                "bucket": phase[0] if phase else None,
                "part": phase[1] if phase else None,
                "status": STATUS_NAMES.get(span["status_code"], str(span["status_code"])),
                "status_message": span["status_message"],
                "scope": span["scope"],
                "depth": depth,
                "has_children": bool(kids),
                "start_ms": round((span["start_ns"] - t0) / 1e6, 3),
                "duration_ms": round(max(0, span["end_ns"] - span["start_ns"]) / 1e6, 3),
                "left_pct": round((span["start_ns"] - t0) / total * 100, 3),
                "width_pct": round(max(0, span["end_ns"] - span["start_ns"]) / total * 100, 3),
                "attributes": bounded_attributes(span["attributes"], trace_id),
                "events": [
                    {
                        **e,
                        "attributes": bounded_attributes(e.get("attributes") or {}, trace_id),
                        "offset_ms": round((int(e.get("time_ns") or 0) - t0) / 1e6, 3),
                    }
                    for e in span["events"]
                ],
                "links": [
                    {**lk, "attributes": bounded_attributes(lk.get("attributes") or {}, trace_id)}
                    for lk in span["links"]
                ],
                "resource": bounded_attributes(span["resource"], trace_id),
            }
        )
        stack.extend((k, depth + 1, span["span_id"]) for k in reversed(kids))
    return out


def _request_span(spans: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any] | None:
    candidates = [s for s in spans if s["name"] == sc.SPAN_REQUEST]
    for s in candidates:
        if str(s["attributes"].get(sc.REQUEST_ID) or s["span_id"]) == request["request_id"]:
            return s
    return candidates[0] if len(candidates) == 1 else None


def _client_span(
    spans: list[dict[str, Any]], request: dict[str, Any], request_span: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Gives the request's client span: the nearest CLIENT span above its tokentrace request
    span; without one, the client span its row's E starts at (the user's span the analyzer
    chose, `analyzer/conventions/_sides.py`: an LLM call's span of any kind, OpenInference's
    INTERNAL one too).  None: the request has no client span kept."""
    if request_span is not None:
        by_id = {s["span_id"]: s for s in spans}
        parent = by_id.get(request_span["parent_span_id"])
        for _ in range(64):
            if parent is None:
                return None
            if parent["kind"] == KIND_CLIENT:  # the user's side of this request
                return parent
            parent = by_id.get(parent["parent_span_id"])
        return None
    start = int(request["start_ns"])
    for s in spans:  # by start: the outermost of spans that start together comes first
        if s["start_ns"] == start and (s["kind"] == KIND_CLIENT or is_llm_client(as_span(s))):
            return s
    return None


def _buckets(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Gives the request's four buckets (queue split into its parts) with their share of E2E.

    `share` (0..1, None when the part was not measured: network without a client span,
    a queue part the request's convention does not report) is what the page shows,
    through the `pct` filter like every share on the pages; `pct` (0..100, 0 when not
    measured) sizes the bar's segments."""
    e2e = request.get("e2e_ms") or 0.0
    unmeasured = UNMEASURED_PARTS.get(request.get("source") or "", frozenset())
    parts = [
        ("network", request.get("network_ms")),
        ("queue_wait", request.get("queue_wait_ms")),
        ("tokenize", request.get("tokenize_ms")),
        ("other", request.get("other_ms")),
        ("prefill", request.get("prefill_ms")),
        ("decode", request.get("decode_ms")),
    ]
    out = []
    for name, ms in parts:
        if name in unmeasured:
            ms = None
        bucket = "queue" if name in ("queue_wait", "tokenize", "other") else name
        out.append(
            {
                "name": name,
                "bucket": bucket,
                "ms": None if ms is None else round(ms, 3),
                "share": None if ms is None or not e2e else round(ms / e2e, 6),
                "pct": round((ms or 0.0) / e2e * 100, 2) if e2e else 0.0,
            }
        )
    return out


#: Whether the token timeline has the request's token times: `recorded` (its request span
#: carries them), `client` (the server sent none, and the row's token times are its client
#: span's chunks: vLLM's span under OpenLLMetry's), `not_kept` (the trace's spans were
#: sampled out, only the summary is stored), `not_recorded` (spans kept whole, but their
#: emitter sends no per-token times: vLLM, SGLang, TGI, a plain OpenTelemetry span).
TOKEN_TIMES = ("recorded", "client", "not_kept", "not_recorded")


def _token_times(
    spans: list[dict[str, Any]],
    request: dict[str, Any],
    request_span: dict[str, Any] | None,
    tokens: list[int],
    chunks: list[int],
) -> str:
    """Gives which of TOKEN_TIMES holds for one request of the trace."""
    if tokens or (request_span is not None and sc.TOKEN_OFFSETS_US in request_span["attributes"]):
        return "recorded"
    if not spans:
        return "not_kept"
    return (
        "client"
        if chunks and request.get("token_times_source") == TOKEN_TIMES_CLIENT
        else "not_recorded"
    )


def _shared_requests(
    cur: duckdb.DuckDBPyConnection,
    request_id: str,
    steps: list[dict[str, Any]],
    start: int,
    end: int,
) -> tuple[list[dict[str, Any]], bool]:
    """Gives the requests batched with `request_id` in its engine's steps that began in
    [start, end], most shared steps first, and a truncated flag.  Counted from the steps the
    timeline has already read (each served step carries the ids it served, `served_with`),
    so `engine_steps` is not read again; only their summaries are looked up."""
    counts: dict[str, int] = {}
    for step in steps:
        if step["start_ns"] >= start and step["served_with"]:
            for other in step["served_with"]:
                counts[other] = counts.get(other, 0) + 1
    served = bool(counts)
    counts.pop(request_id, None)
    for step in steps:
        del step["served_with"]  # the timeline's steps, as they were
    if not served:
        # no step of its own engine names it: steps recorded under another service may (an
        # engine process of its own); read once more, only for such requests
        rows = cur.execute(queries.load("trace_steps_naming"), [request_id, start, end]).fetchall()
        counts = {str(other): int(n) for other, n in rows if other != request_id}
    if not counts:
        return [], False
    return fetch_dicts(
        cur,
        queries.load("trace_shared_requests"),
        [request_id, list(counts), list(counts.values()), start, end],
        cap=SHARED_CAP,
    )


def _request_window(request: dict[str, Any], spans: list[dict[str, Any]]) -> dict[str, Any]:
    """Gives the request's spans (its request span, its client span) and the window its
    timeline covers: its own lifetime, widened to those spans'."""
    req_span = _request_span(spans, request)
    client = _client_span(spans, request, req_span)
    start = int(request["start_ns"])
    end = start + int(float(request["e2e_ms"] or 0) * 1e6)
    if req_span is not None:
        start, end = min(start, req_span["start_ns"]), max(end, req_span["end_ns"])
    if client is not None:
        start, end = min(start, client["start_ns"]), max(end, client["end_ns"])
    return {"request_span": req_span, "client": client, "start": start, "end": end}


def _engine_reads(
    cur: duckdb.DuckDBPyConnection, request: dict[str, Any], start: int, end: int
) -> tuple[list[dict[str, Any]], bool, list[dict[str, Any]], bool]:
    """Gives the request's engine steps (and a truncated flag), then the requests that shared
    them (and theirs): the second read needs the first's steps."""
    service, instance = request.get("service") or "", request.get("instance") or ""
    steps, steps_truncated = fetch_dicts(
        cur,
        queries.load("trace_engine_steps"),
        [request["request_id"], start, end, service, instance, start - STEP_LOOKBACK_NS],
        cap=20_000,
    )
    with time_limit(cur):
        shared, shared_truncated = _shared_requests(cur, request["request_id"], steps, start, end)
    return steps, steps_truncated, shared, shared_truncated


def _gpu_samples(
    cur: duckdb.DuckDBPyConnection, request: dict[str, Any], start: int, end: int
) -> list[dict[str, Any]]:
    """Gives the GPU samples of the request's service in its window."""
    rows, _ = fetch_dicts(
        cur, queries.load("trace_gpu_samples"), [start, end, request.get("service") or ""], cap=5000
    )
    return rows


def _request_view(
    reads: SideBySide, request: dict[str, Any], spans: list[dict[str, Any]]
) -> dict[str, Any]:
    window = _request_window(request, spans)
    req_span, client = window["request_span"], window["client"]
    start, end = window["start"], window["end"]
    # the GPU samples and the engine steps (then their shared requests) at once: over a lake
    # each read is mostly the catalog's round trips, so side by side they cost the longer one
    gpu_read = reads.submit(_gpu_samples, request, start, end)
    engine_read = reads.submit(_engine_reads, request, start, end)
    gpu = gpu_read.result()
    steps, steps_truncated, shared, shared_truncated = engine_read.result()
    tokens = token_times_ns(req_span)
    chunks = client_chunk_times_ns(client)
    token_times = _token_times(spans, request, req_span, tokens, chunks)
    stalls_from = TOKEN_TIMES_CLIENT if token_times == "client" else TOKEN_TIMES_SERVER
    timeline = build_timeline(start, end, tokens, chunks, steps, gpu, stalls_from)
    summary = {k: v for k, v in request.items()}
    return {
        "summary": summary,
        "buckets": _buckets(request),
        "has_spans": req_span is not None,
        "token_times": token_times,
        # the span the client chunks are read from (its name is the sender's: escaped)
        "client_span": None
        if client is None
        else {"span_id": client["span_id"], "name": client["name"]},
        "timeline": timeline,
        "engine_steps": {
            "overlapping": len(steps),
            "served": sum(1 for s in steps if s["served"]),
            "truncated": steps_truncated,
        },
        "shared_requests": shared,
        "shared_truncated": shared_truncated,
    }


def _kept(cur: duckdb.DuckDBPyConnection, trace_id: str) -> list[dict[str, Any]]:
    rows, _ = fetch_dicts(
        cur,
        "SELECT reason, weight, decided_ns, span_count FROM kept_traces WHERE trace_id = ?",
        [trace_id],
        cap=10,
    )
    return rows


def _requests(cur: duckdb.DuckDBPyConnection, trace_id: str) -> tuple[list[dict[str, Any]], bool]:
    return fetch_dicts(
        cur,
        "SELECT * FROM requests WHERE trace_id = ? ORDER BY start_ns, request_id",
        [trace_id],
        cap=REQUEST_CAP,
    )


def trace_data(cur: duckdb.DuckDBPyConnection, trace_id: str) -> dict[str, Any]:
    """Gives everything the trace view shows for one trace; raises TraceNotFound.

    The reads that do not wait for each other run at once (`_reads.side_by_side`): the three
    look-ups by trace id, then each request's GPU samples beside its engine steps."""
    with side_by_side(cur) as reads:
        requests_read = reads.submit(_requests, trace_id)
        spans_read = reads.submit(load_spans, trace_id)
        kept_read = reads.submit(_kept, trace_id)
        requests, requests_truncated = requests_read.result()
        spans, spans_truncated = spans_read.result()
        kept = kept_read.result()
        if not requests and not spans:
            raise TraceNotFound(f"no request or span with trace id {trace_id}")
        views = [_request_view(reads, r, spans) for r in requests]
    starts = [s["start_ns"] for s in spans] + [int(r["start_ns"]) for r in requests]
    ends = [s["end_ns"] for s in spans] + [
        int(r["start_ns"]) + int(float(r["e2e_ms"] or 0) * 1e6) for r in requests
    ]
    t0, t1 = min(starts), max(ends)
    return {
        "trace_id": trace_id,
        "start_ns": t0,
        "duration_ms": round((t1 - t0) / 1e6, 3),
        "kept": {**kept[0], "why": kept_why(str(kept[0]["reason"]))} if kept else None,
        "spans": waterfall(spans, t0, t1, trace_id),
        "span_count": len(spans),
        "spans_truncated": spans_truncated,
        "requests": views,
        "requests_truncated": requests_truncated,
    }
