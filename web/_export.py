"""A stored trace as OTLP/JSON (re-importable anywhere) or Chrome/Perfetto trace events."""

from __future__ import annotations

import json
from typing import Any

from tokentrace.instrumentation import semconv as sc
from tokentrace.web._long_values import bounded_attributes
from tokentrace.web._timeline import MAX_TIMES_DRAWN, thin_times, token_times_ns


def _any_value(value: Any) -> dict[str, Any]:
    """Gives the OTLP/JSON AnyValue of a plain Python value (ints as strings, per the spec)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": _key_values(value)}}
    return {"stringValue": "" if value is None else str(value)}


def _key_values(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": str(k), "value": _any_value(v)} for k, v in attrs.items()]


def to_otlp_json(trace_id: str, spans: list[dict[str, Any]]) -> dict[str, Any]:
    """Gives an OTLP/JSON ExportTraceServiceRequest holding the trace's spans."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    resources: dict[str, dict[str, Any]] = {}
    for s in spans:
        rkey = json.dumps(s["resource"], sort_keys=True, default=str)
        resources[rkey] = s["resource"]
        groups.setdefault((rkey, s["scope"]), []).append(
            {
                "traceId": trace_id,
                "spanId": s["span_id"],
                "parentSpanId": s["parent_span_id"],
                "name": s["name"],
                "kind": s["kind"],
                "startTimeUnixNano": str(s["start_ns"]),
                "endTimeUnixNano": str(s["end_ns"]),
                "attributes": _key_values(s["attributes"]),
                "events": [
                    {
                        "timeUnixNano": str(e.get("time_ns", 0)),
                        "name": str(e.get("name", "")),
                        "attributes": _key_values(e.get("attributes") or {}),
                    }
                    for e in s["events"]
                ],
                "links": [
                    {
                        "traceId": str(lk.get("trace_id", "")),
                        "spanId": str(lk.get("span_id", "")),
                        "attributes": _key_values(lk.get("attributes") or {}),
                    }
                    for lk in s["links"]
                ],
                "status": {"code": s["status_code"], "message": s["status_message"]},
            }
        )
    by_resource: dict[str, list[dict[str, Any]]] = {}
    for (rkey, scope), scope_spans in groups.items():
        by_resource.setdefault(rkey, []).append({"scope": {"name": scope}, "spans": scope_spans})
    return {
        "resourceSpans": [
            {"resource": {"attributes": _key_values(resources[rkey])}, "scopeSpans": scope_spans}
            for rkey, scope_spans in by_resource.items()
        ]
    }


def _lane(lanes: list[list[int]], start: int, end: int) -> int:
    """Gives the first lane where [start, end] nests inside what is open (Perfetto needs nesting)."""
    for i, open_ends in enumerate(lanes):
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
        if not open_ends or open_ends[-1] >= end:
            open_ends.append(end)
            return i
    lanes.append([end])
    return len(lanes) - 1


def to_chrome_trace(trace_id: str, spans: list[dict[str, Any]], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Gives Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev): spans, tokens, engine steps.

    Bounded however many token times a request span carries: at most MAX_TIMES_DRAWN token
    instants per request, thinned as the trace page's timeline thins its ticks (each named by
    its number among them all), and list attributes summarized in the spans' args, as on the
    page (a million token offsets made a 99 MB file, built in memory). `otherData` says how
    many token times were left out; every one is in the OTLP JSON export.
    """
    t0 = min((s["start_ns"] for s in spans), default=0)
    events: list[dict[str, Any]] = []
    tokens_left_out = 0
    pids: dict[str, int] = {}
    lanes: dict[int, list[list[int]]] = {}
    for s in sorted(spans, key=lambda s: (s["start_ns"], -s["end_ns"])):
        service = s["service_name"] or "unknown"
        pid = pids.setdefault(service, len(pids) + 1)
        tid = _lane(lanes.setdefault(pid, []), s["start_ns"], s["end_ns"]) + 1
        events.append(
            {
                "name": s["name"],
                "cat": "span",
                "ph": "X",
                "ts": (s["start_ns"] - t0) / 1000,
                "dur": max(0, s["end_ns"] - s["start_ns"]) / 1000,
                "pid": pid,
                "tid": tid,
                "args": {"span_id": s["span_id"], **bounded_attributes(s["attributes"], trace_id)},
            }
        )
        for e in s["events"]:
            events.append(
                {"name": str(e.get("name", "")), "cat": "event", "ph": "i", "s": "t",
                 "ts": (int(e.get("time_ns") or 0) - t0) / 1000, "pid": pid, "tid": tid,
                 "args": bounded_attributes(e.get("attributes") or {}, trace_id)}
            )  # fmt: skip
        if s["name"] == sc.SPAN_REQUEST:
            tokens = token_times_ns(s)
            drawn = thin_times(tokens, s["start_ns"], max([s["end_ns"], s["start_ns"] + 1, *tokens]))
            tokens_left_out += len(tokens) - len(drawn)
            for i in drawn:
                events.append(
                    {"name": f"token {i + 1}", "cat": "token", "ph": "i", "s": "t",
                     "ts": (tokens[i] - t0) / 1000, "pid": pid, "tid": tid}
                )  # fmt: skip
    engine_pid = len(pids) + 1
    for step in steps:
        events.append(
            {
                # an engine that does not give the batch size: unknown, not "None" or 0
                "name": f"step batch={step['batch_size'] if step['batch_size'] is not None else '?'}",
                "cat": "engine_step",
                "ph": "X",
                "ts": (step["start_ns"] - t0) / 1000,
                "dur": step["duration_us"],
                "pid": engine_pid,
                "tid": 1 if step["served"] else 2,
                "args": {k: step[k] for k in ("batch_size", "prefill_tokens", "decode_seqs", "queue_depth", "kv_usage")},
            }
        )
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}} for name, pid in pids.items()]
    if steps:
        meta.append({"name": "process_name", "ph": "M", "pid": engine_pid, "args": {"name": "engine steps"}})
    other: dict[str, Any] = {"trace_id": trace_id}
    if tokens_left_out:
        other["tokens_not_drawn"] = tokens_left_out
        other["note"] = (
            f"at most {MAX_TIMES_DRAWN:,} token instants per request; "
            f"{tokens_left_out:,} token times left out are in /api/trace/{trace_id}/otlp.json"
        )
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other}
