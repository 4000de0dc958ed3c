"""Realistic traces in tokentrace's own span convention, written as OTLP/JSON files.

Each request is a client span (CLIENT) around the server's `tokentrace.request`
(SERVER) with its phase spans, token offsets and client chunk offsets; engine
steps travel as `tokentrace.engine.steps` batches and GPU samples as OTLP/JSON
gauges, exactly as the SDK sends them.  The files go through the collector's
real import path, so the database the web pages read is the real thing.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokentrace.collector.collector import Collector
from tokentrace.collector.otlp_metrics import decode_metrics_json
from tokentrace.collector.settings import CollectorSettings
from tokentrace.collector.writer import WriteBatch
from tokentrace.file_import import import_files
from tokentrace.instrumentation import semconv as sc

BASE_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z
SERVICE = "llm-server"
INSTANCE = "pod-1"
MODELS = ("llama-8b", "qwen-7b")
TENANTS = ("acme", "globex", "initech")
STEP_NS = 25_000_000
XSS_NAME = "<script>alert('span-name')</script>"
XSS_ATTR = '"><img src=x onerror=alert(1)>'


@dataclass
class GeneratedRequest:
    trace_id: str
    request_id: str
    start_ns: int
    end_ns: int
    model: str
    tenant: str
    traffic_class: str
    stalled: bool
    tokens_abs_ns: list[int] = field(default_factory=list)


def _kv(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for k, v in attrs.items():
        if isinstance(v, bool):
            val: dict[str, Any] = {"boolValue": v}
        elif isinstance(v, int):
            val = {"intValue": str(v)}
        elif isinstance(v, float):
            val = {"doubleValue": v}
        elif isinstance(v, list):
            val = {"arrayValue": {"values": [_kv({"x": x})[0]["value"] for x in v]}}
        else:
            val = {"stringValue": str(v)}
        out.append({"key": k, "value": val})
    return out


def _span(trace_id: str, span_id: str, parent: str, name: str, kind: int, start: int, end: int,
          attrs: dict[str, Any] | None = None, events: list[dict[str, Any]] | None = None,
          status: int = 0) -> dict[str, Any]:  # fmt: skip
    return {
        "traceId": trace_id, "spanId": span_id, "parentSpanId": parent, "name": name, "kind": kind,
        "startTimeUnixNano": str(start), "endTimeUnixNano": str(end), "attributes": _kv(attrs or {}),
        "events": events or [], "status": {"code": status},
    }  # fmt: skip


def _doc(service: str, spans: list[dict[str, Any]]) -> dict[str, Any]:
    resource = {sc.SERVICE_NAME: service, sc.SERVICE_INSTANCE: INSTANCE, sc.DEPLOYMENT_ENV: "prod"}
    return {
        "resourceSpans": [
            {"resource": {"attributes": _kv(resource)}, "scopeSpans": [{"scope": {"name": "tokentrace"}, "spans": spans}]}
        ]
    }


def _request_spans(rng: random.Random, i: int, start: int, evil: bool) -> tuple[list[dict[str, Any]], GeneratedRequest]:
    trace_id = f"{rng.getrandbits(128):032x}"
    ids = [f"{rng.getrandbits(64):016x}" for _ in range(7)]
    model, tenant = MODELS[i % 2], TENANTS[i % 3]
    klass = sc.TRAFFIC_BATCH if i % 5 == 4 else sc.TRAFFIC_INTERACTIVE
    network_ns = rng.randint(5, 40) * 10**6
    tokenize_ns = rng.randint(1, 5) * 10**6
    queue_ns = rng.randint(2, 120) * 10**6
    prefill_ns = rng.randint(30, 250) * 10**6
    n_tokens = rng.randint(8, 40)
    stalled = i % 7 == 3
    server_start = start + network_ns // 2
    t = server_start + tokenize_ns + queue_ns
    prefill_start = t
    t += prefill_ns
    tokens = [t]
    for k in range(1, n_tokens):
        gap = rng.randint(15, 30) * 10**6
        if stalled and k == n_tokens // 2:
            gap = rng.randint(400, 700) * 10**6
        t += gap
        tokens.append(t)
    server_end = t + 2 * 10**6
    client_end = server_end + network_ns // 2
    request_id = f"req-{i:04d}"
    offsets_us = [(x - server_start) // 1000 for x in tokens]
    chunk_offsets_us = [(x - start + network_ns // 2) // 1000 for x in tokens]
    req_attrs: dict[str, Any] = {
        sc.REQUEST_ID: request_id, sc.REQUEST_MODEL: model, sc.TENANT: tenant, sc.TRAFFIC_CLASS: klass,
        sc.PROMPT_TOKENS: rng.randint(20, 2000), sc.OUTPUT_TOKENS: n_tokens,
        sc.TOKEN_OFFSETS_US: sc.pack_list(offsets_us),  # as the SDK sends it (client chunks: an array)
        sc.ROUTE: "/v1/chat/completions",
    }  # fmt: skip
    name = sc.SPAN_REQUEST
    if evil:
        req_attrs["user.note"] = XSS_ATTR
        req_attrs["html"] = XSS_NAME
    spans = [
        _span(trace_id, ids[0], "", sc.SPAN_CLIENT, 3, start, client_end,
              {sc.CLIENT_CHUNK_OFFSETS_US: chunk_offsets_us, sc.REQUEST_MODEL: model}),
        _span(trace_id, ids[1], ids[0], name, 2, server_start, server_end, req_attrs,
              events=[{"timeUnixNano": str(tokens[0]), "name": "first token" if not evil else XSS_ATTR,
                       "attributes": _kv({"evil": XSS_NAME} if evil else {})}],
              status=2 if evil else 0),  # an error: always kept, so its spans show
        _span(trace_id, ids[2], ids[1], sc.SPAN_TOKENIZE, 1, server_start, server_start + tokenize_ns),
        _span(trace_id, ids[3], ids[1], sc.SPAN_QUEUE, 1, server_start + tokenize_ns, prefill_start),
        _span(trace_id, ids[4], ids[1], sc.SPAN_PREFILL, 1, prefill_start, tokens[0]),
        _span(trace_id, ids[5], ids[1], sc.SPAN_DECODE, 1, tokens[0], tokens[-1]),
        _span(trace_id, ids[6], ids[1], XSS_NAME if evil else sc.SPAN_DETOKENIZE, 1, tokens[-1], server_end,
              {"evil": XSS_ATTR} if evil else {}),
    ]  # fmt: skip
    gen = GeneratedRequest(trace_id, request_id, start, client_end, model, tenant, klass, stalled, tokens)
    gen.start_ns = prefill_start  # engine steps serve a request from its first prefill step
    return spans, gen


def _engine_step_spans(rng: random.Random, requests: list[GeneratedRequest], t0: int, t1: int) -> list[dict[str, Any]]:
    trace_id = f"{rng.getrandbits(128):032x}"
    starts, durs, prefill, decode, batch, queue, kv, gpu, req_ids = ([] for _ in range(9))
    t = t0
    while t < t1:
        active = [r.request_id for r in requests if r.start_ns <= t + STEP_NS and r.tokens_abs_ns[-1] >= t]
        starts.append(t)
        durs.append(STEP_NS // 1000 - rng.randint(0, 3000))
        prefill.append(rng.choice((0, 0, 0, 512)))
        decode.append(len(active))
        batch.append(len(active))
        queue.append(rng.randint(0, 6))
        kv.append(round(rng.uniform(0.2, 0.9), 3))
        gpu.append(STEP_NS // 1000 - 5000)
        req_ids.append(",".join(active))
        t += STEP_NS
    spans = []
    for k in range(0, len(starts), 400):
        sl = slice(k, k + 400)
        attrs = {
            sc.STEP_START_NS: starts[sl], sc.STEP_DURATION_US: durs[sl], sc.STEP_PREFILL_TOKENS: prefill[sl],
            sc.STEP_DECODE_SEQS: decode[sl], sc.STEP_BATCH_SIZE: batch[sl], sc.STEP_QUEUE_DEPTH: queue[sl],
            sc.STEP_KV_USAGE: kv[sl], sc.STEP_GPU_US: gpu[sl], sc.STEP_REQUEST_IDS: req_ids[sl],
        }  # fmt: skip
        attrs = {key: sc.pack_list(values) for key, values in attrs.items()}  # as the SDK sends them
        spans.append(
            _span(trace_id, f"{rng.getrandbits(64):016x}", "", sc.SPAN_ENGINE_STEPS, 1, starts[sl][0],
                  starts[sl][-1] + STEP_NS, attrs)
        )  # fmt: skip
    return spans


def _gpu_metrics(t0: int, t1: int) -> dict[str, Any]:
    points = []
    t = t0
    k = 0
    while t < t1:
        points.append({"timeUnixNano": str(t), "asDouble": 40.0 + (k * 7) % 55, "attributes": _kv({sc.GPU_INDEX: 0})})
        t += 100_000_000
        k += 1
    resource = {sc.SERVICE_NAME: SERVICE, sc.SERVICE_INSTANCE: INSTANCE}
    return {
        "resourceMetrics": [
            {
                "resource": {"attributes": _kv(resource)},
                "scopeMetrics": [{"metrics": [{"name": sc.METRIC_GPU_UTIL, "gauge": {"dataPoints": points}}]}],
            }
        ]
    }


def generate(tmp: Path, count: int = 120, seed: int = 7, evil: bool = True) -> tuple[Path, list[GeneratedRequest]]:
    """Writes `count` requests (the first one with XSS payloads when `evil`) into a fresh DuckDB."""
    rng = random.Random(seed)
    docs: list[dict[str, Any]] = []
    requests: list[GeneratedRequest] = []
    for i in range(count):
        start = BASE_NS + i * 400_000_000 + rng.randint(0, 200_000_000)
        spans, gen = _request_spans(rng, i, start, evil and i == 0)
        docs.append(_doc(SERVICE, spans))
        requests.append(gen)
    t0 = min(r.start_ns for r in requests) - STEP_NS
    t1 = max(r.end_ns for r in requests)
    docs.append(_doc(SERVICE, _engine_step_spans(rng, requests, t0, t1)))
    path = tmp / "traces.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in docs))
    db = tmp / "web.duckdb"
    settings = CollectorSettings(db=db, baseline=0.3, slo_itl_ms=300.0, p99_warmup=0)  # some sampled out
    import_files(settings, [path])
    gpu = decode_metrics_json(_gpu_metrics(t0, t1))
    collector = Collector(settings)
    try:
        assert collector.pipeline.add_engine_data(WriteBatch(gpu_samples=gpu.rows))
    finally:
        collector.close()
    return db, requests


#: `generate_emitters`' traces: vLLM's `llm_request` spans, kept whole, that carry no
#: per-token times; one says how many tokens it produced, the other does not.
VLLM_OUTPUT_TOKENS = 128


def generate_emitters(tmp: Path) -> tuple[Path, dict[str, str]]:
    """Writes traces of another emitter (vLLM) into a fresh DuckDB, every one kept whole;
    gives the database and the trace ids by name (`with_count`, `without_count`)."""
    ids: dict[str, str] = {}
    docs = []
    for i, name in enumerate(("with_count", "without_count")):
        trace_id = f"{0xABC0 + i:032x}"
        start = BASE_NS + i * 10**9
        attrs: dict[str, Any] = {
            "gen_ai.request.id": f"cmpl-{name}", "gen_ai.response.model": "llama-8b",
            "gen_ai.latency.e2e": 2.9, "gen_ai.latency.time_to_first_token": 0.35,
            "gen_ai.latency.time_in_queue": 0.1, "gen_ai.latency.time_in_model_prefill": 0.25,
            "gen_ai.latency.time_in_model_decode": 2.55, "gen_ai.latency.time_in_model_inference": 2.8,
        }  # fmt: skip
        if name == "with_count":
            attrs |= {"gen_ai.usage.prompt_tokens": 900, "gen_ai.usage.completion_tokens": VLLM_OUTPUT_TOKENS}
        span = _span(trace_id, f"{0x100 + i:016x}", "", "llm_request", 2, start, start + 2_900_000_000, attrs)
        docs.append(_doc("vllm", [span]))
        ids[name] = trace_id
    path = tmp / "vllm.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in docs))
    db = tmp / "web.duckdb"
    import_files(CollectorSettings(db=db, baseline=1.0), [path])
    return db, ids
