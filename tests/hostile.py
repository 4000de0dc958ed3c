"""Traces whose every string a sender controls is hostile, written through the real import path.

Service name, instance and environment, resource attributes (keys and values), scope,
span names, attribute keys and values, event names and attributes, status messages, link
attributes, request ids, models and tenants all carry one of PAYLOADS; doubles are NaN and
±Infinity (OTLP/JSON allows them).  Each payload gets a trace of its own, with
engine steps shared between them so the trace view's "shared requests" show too.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracegen import BASE_NS, _kv, _span

from tokentrace.collector.settings import CollectorSettings
from tokentrace.file_import import import_files
from tokentrace.instrumentation import semconv as sc

#: What a hostile sender puts in every string: markup that breaks out of text, attributes,
#: <script> blocks and JS string literals, URLs that run script, template syntax, a NUL.
PAYLOADS = {
    "script": "</script><script>alert('script')</script>",
    "attr": '"><img src=x onerror=alert(\'attr\')>',
    "single": "'><svg onload=alert('single')>",
    "url": "javascript:alert('url')",
    "template": "{{7*7}}{% raw %}${7*7}#{7*7}",
    "separators": "line\u2028para\u2029</script><script>alert('sep')</script>",
    "nul": "nul\x00<u id=injected>byte</u>",
    "long": "L" * 20_000 + "<img src=x onerror=alert('long')>",
}
#: Non-finite doubles a sender may send as attribute values (OTLP/JSON allows them).
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "neg-inf": "-Infinity"}
STEP_NS = 25_000_000


@dataclass
class HostileTrace:
    payload_name: str
    payload: str
    trace_id: str
    request_id: str


def _everything(p: str) -> dict[str, Any]:
    """Attributes whose keys and values are `p`, plus non-finite doubles."""
    return {p: p, f"{p}.list": [p, p], "key.of": p}


def _request_doc(rng: random.Random, name: str, p: str, start: int) -> tuple[dict[str, Any], HostileTrace, list[int]]:
    trace_id = f"{rng.getrandbits(128):032x}"
    ids = [f"{rng.getrandbits(64):016x}" for _ in range(4)]
    request_id = f"{p}-{name}"  # unique per trace, the payload verbatim
    server_start = start + 5_000_000
    tokens = [server_start + 50_000_000 + k * 20_000_000 for k in range(10)]
    tokens[6] += 600_000_000  # a stall: the stall table shows too
    for k in range(7, 10):
        tokens[k] += 600_000_000
    end = tokens[-1] + 2_000_000
    attrs = {
        sc.REQUEST_ID: request_id, sc.REQUEST_MODEL: p, sc.TENANT: p, sc.TRAFFIC_CLASS: p,
        sc.PROMPT_TOKENS: 12, sc.OUTPUT_TOKENS: len(tokens),
        sc.TOKEN_OFFSETS_US: sc.pack_list([(t - server_start) // 1000 for t in tokens]),
        **_everything(p),
    }  # fmt: skip
    non_finite = [{"key": f"double.{k}", "value": {"doubleValue": v}} for k, v in NON_FINITE.items()]
    link = {"traceId": f"{rng.getrandbits(128):032x}", "spanId": ids[3], "attributes": _kv(_everything(p))}
    request = _span(trace_id, ids[1], ids[0], sc.SPAN_REQUEST, 2, server_start, end, attrs,
                    events=[{"timeUnixNano": str(tokens[0]), "name": p, "attributes": _kv(_everything(p))}],
                    status=2)  # fmt: skip
    request["attributes"] += non_finite
    request["status"]["message"] = p
    request["links"] = [link]
    spans = [
        _span(trace_id, ids[0], "", p, 3, start, end + 5_000_000, {sc.REQUEST_MODEL: p, **_everything(p)}),
        request,
        _span(trace_id, ids[2], ids[1], p, 1, tokens[0], end, _everything(p)),
    ]
    resource = {sc.SERVICE_NAME: p, sc.SERVICE_INSTANCE: p, sc.DEPLOYMENT_ENV: p, **_everything(p)}
    doc = {
        "resourceSpans": [
            {"resource": {"attributes": _kv(resource)}, "scopeSpans": [{"scope": {"name": p}, "spans": spans}]}
        ]
    }
    return doc, HostileTrace(name, p, trace_id, request_id), [server_start, end]


def _engine_steps(rng: random.Random, service: str, traces: list[HostileTrace], t0: int, t1: int) -> dict[str, Any]:
    """Steps of `service` that served every hostile request, so each trace lists the others."""
    starts = list(range(t0, t1, STEP_NS))[:400]
    n = len(starts)
    ids = ",".join(t.request_id for t in traces)
    attrs = {
        sc.STEP_START_NS: starts, sc.STEP_DURATION_US: [STEP_NS // 1000 - 1000] * n,
        sc.STEP_PREFILL_TOKENS: [0] * n, sc.STEP_DECODE_SEQS: [len(traces)] * n,
        sc.STEP_BATCH_SIZE: [len(traces)] * n, sc.STEP_QUEUE_DEPTH: [1] * n, sc.STEP_KV_USAGE: [0.5] * n,
        sc.STEP_GPU_US: [1000] * n, sc.STEP_REQUEST_IDS: [ids] * n,
    }  # fmt: skip
    packed = {key: sc.pack_list(values) for key, values in attrs.items()}
    span = _span(f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}", "", sc.SPAN_ENGINE_STEPS, 1,
                 starts[0], starts[-1] + STEP_NS, packed)  # fmt: skip
    resource = {sc.SERVICE_NAME: service, sc.SERVICE_INSTANCE: service}
    return {"resourceSpans": [{"resource": {"attributes": _kv(resource)}, "scopeSpans": [{"spans": [span]}]}]}


def generate_hostile(tmp: Path, seed: int = 11) -> tuple[Path, list[HostileTrace]]:
    """Writes one trace per payload into a fresh DuckDB, with engine steps (of service
    `PAYLOADS["attr"]`) that served every request: each trace lists the others as shared."""
    rng = random.Random(seed)
    docs, traces = [], []
    t0, t1 = None, 0
    for i, (name, p) in enumerate(PAYLOADS.items()):
        doc, trace, (start, end) = _request_doc(rng, name, p, BASE_NS + i * 50_000_000)
        docs.append(doc)
        traces.append(trace)
        t0, t1 = start if t0 is None else min(t0, start), max(t1, end)
    assert t0 is not None
    docs.append(_engine_steps(rng, PAYLOADS["attr"], traces, t0, t1))
    path = tmp / "hostile.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in docs))
    db = tmp / "hostile.duckdb"
    import_files(CollectorSettings(db=db, baseline=1.0, slo_itl_ms=300.0), [path])
    return db, traces
