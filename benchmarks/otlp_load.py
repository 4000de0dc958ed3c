"""Realistic OTLP load: tokentrace-convention request traces (~6 spans each, the
token times on the request span packed as one JSON string as today's SDK sends
them, or an int array as older SDKs did), many traces per export, as the SDK's
batch exporter sends them.

    python benchmarks/otlp_load.py --endpoint http://127.0.0.1:4318 --seconds 10 --rate 20000

Used by `bench_collector.py` and `soak_collector.py`; run alone it sends at a
fixed span rate (0 = as fast as possible) and prints accepted / refused counts.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tokentrace.instrumentation.semconv import TOKEN_OFFSETS_US, pack_list

SPANS_PER_TRACE = 6
#: Every trace id of a template starts with this; each send replaces it with a
#: fresh 4-byte counter (one C-speed `bytes.replace`), so a payload can be sent
#: many times and every send still carries new traces.
TRACE_PREFIX = b"\xfe\xed\xfa\xce"
PB = {"Content-Type": "application/x-protobuf"}
MODELS = ("llama-3-8b", "qwen-2.5-7b", "mistral-7b")
ROUTES = ("/v1/chat/completions", "/v1/completions")
PHASES = ("tokentrace.tokenize", "tokentrace.queue", "tokentrace.prefill", "tokentrace.decode",
          "tokentrace.detokenize")  # fmt: skip


def _kv(key: str, **value: object) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))  # type: ignore[arg-type]


def build_export(
    traces: int, rng: random.Random, start_ns: int | None = None, packed: bool = True
) -> bytes:
    """Gives one serialized ExportTraceServiceRequest of `traces` request traces
    (`packed`: token times as one JSON string, else an OTLP int array)."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([
        _kv("service.name", string_value="llm-server"),
        _kv("service.instance.id", string_value=f"pod-{os.getpid()}"),
        _kv("deployment.environment.name", string_value="prod"),
    ])  # fmt: skip
    ss = rs.scope_spans.add()
    ss.scope.name = "tokentrace"
    t0 = start_ns or time.time_ns()
    for _ in range(traces):
        trace_id = TRACE_PREFIX + rng.randbytes(12)
        root_id = rng.randbytes(8)
        tokens = rng.randint(16, 128)
        queue_us = rng.expovariate(1 / 20_000)
        ttft_us = int(queue_us + rng.uniform(20_000, 150_000))
        itl = rng.uniform(8_000, 30_000)
        offsets = [int(ttft_us + i * itl * rng.uniform(0.7, 1.3)) for i in range(tokens)]
        offsets.sort()
        end_us = offsets[-1] + 500
        bounds = [(0, 800), (800, int(800 + queue_us)), (int(800 + queue_us), ttft_us),
                  (ttft_us, offsets[-1]), (offsets[-1], end_us)]  # fmt: skip
        for name, (a, b) in zip(PHASES, bounds, strict=True):
            ps = ss.spans.add()
            ps.trace_id, ps.span_id, ps.parent_span_id = trace_id, rng.randbytes(8), root_id
            ps.name, ps.kind = name, 1
            ps.start_time_unix_nano, ps.end_time_unix_nano = t0 + a * 1000, t0 + b * 1000
        ps = ss.spans.add()
        ps.trace_id, ps.span_id, ps.name, ps.kind = trace_id, root_id, "tokentrace.request", 2
        ps.start_time_unix_nano, ps.end_time_unix_nano = t0, t0 + end_us * 1000
        offsets_value = AnyValue()
        if packed:
            offsets_value.string_value = pack_list(offsets)
        else:
            offsets_value.array_value.values.extend(AnyValue(int_value=o) for o in offsets)
        ps.attributes.extend([
            _kv("gen_ai.request.model", string_value=rng.choice(MODELS)),
            _kv("http.route", string_value=rng.choice(ROUTES)),
            _kv("tokentrace.tenant", string_value=f"tenant-{rng.randint(1, 20)}"),
            _kv("tokentrace.request.id", string_value=trace_id.hex()[:16]),
            _kv("gen_ai.usage.input_tokens", int_value=rng.randint(20, 2000)),
            _kv("gen_ai.usage.output_tokens", int_value=tokens),
            KeyValue(key=TOKEN_OFFSETS_US, value=offsets_value),
        ])  # fmt: skip
        if rng.random() < 0.005:
            ps.status.code = 2  # type: ignore[assignment]
        t0 += rng.randint(10_000, 2_000_000)
    return req.SerializeToString()


def build_payloads(
    count: int, traces_per_export: int, seed: int = 7, packed: bool = True
) -> list[bytes]:
    """Gives `count` distinct serialized exports (built before timing starts)."""
    rng = random.Random(seed)
    return [build_export(traces_per_export, rng, packed=packed) for _ in range(count)]


@dataclass
class LoadResult:
    exports_sent: int = 0
    spans_accepted: int = 0
    spans_refused: int = 0  # answered 503/429: retried until accepted
    retries: int = 0
    errors: list[str] = field(default_factory=list)


def send(endpoint: str, payloads: list[bytes], spans_per_payload: int, *, seconds: float = 0.0,
         rate: float = 0.0, workers: int = 2, repeat: int = 1) -> LoadResult:  # fmt: skip
    """Sends the payloads (each retried on 503/429 until accepted) from `workers` threads.

    With `seconds` it loops over the payloads for that long; `rate` caps the span
    rate (0 = as fast as the collector takes them).  Each thread keeps one
    keep-alive `http.client` connection, like an OTLP exporter: the sender
    shares the cores with the collector, so it must cost little per export."""
    result = LoadResult()
    lock = threading.Lock()
    generation = iter(range(1, 1 << 32))
    parts = urlsplit(endpoint)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path.rstrip("/") + "/v1/traces"
    deadline = time.monotonic() + seconds if seconds else None
    per_worker_rate = rate / workers if rate else 0.0

    def post(conn: http.client.HTTPConnection, body: bytes) -> tuple[int, str, bytes]:
        conn.request("POST", path, body=body, headers=PB)
        r = conn.getresponse()
        return r.status, r.getheader("Retry-After") or "1", r.read()

    def worker(w: int) -> None:
        mine = payloads[w::workers] or payloads
        started = time.monotonic()
        sent_spans = 0
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            i = 0
            while True:
                if deadline is None and i >= len(mine) * repeat:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    return
                with lock:
                    stamp = next(generation).to_bytes(4, "big")
                body = mine[i % len(mine)].replace(TRACE_PREFIX, stamp)
                i += 1
                if per_worker_rate:
                    due = started + sent_spans / per_worker_rate
                    pause = due - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                while True:
                    try:
                        status, retry_after, text = post(conn, body)
                    except (OSError, http.client.HTTPException) as exc:
                        # a dropped keep-alive connection: one reconnect, then give up
                        conn.close()
                        try:
                            status, retry_after, text = post(conn, body)
                        except (OSError, http.client.HTTPException):
                            with lock:
                                result.errors.append(f"{type(exc).__name__}: {exc}")
                            return
                    if status == 200:
                        with lock:
                            result.exports_sent += 1
                            result.spans_accepted += spans_per_payload
                        sent_spans += spans_per_payload
                        break
                    if status in (429, 503):
                        with lock:
                            result.spans_refused += spans_per_payload
                            result.retries += 1
                        time.sleep(min(float(retry_after), 0.05))
                        continue
                    with lock:
                        result.errors.append(f"HTTP {status}: {text[:200]!r}")
                    return
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="http://127.0.0.1:4318")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=0.0, help="spans/s (0: as fast as possible)")
    ap.add_argument("--traces-per-export", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    payloads = build_payloads(32, args.traces_per_export)
    res = send(args.endpoint, payloads, args.traces_per_export * SPANS_PER_TRACE,
               seconds=args.seconds, rate=args.rate, workers=args.workers)  # fmt: skip
    print(f"accepted {res.spans_accepted} spans in {res.exports_sent} exports, "
          f"{res.retries} refusals retried, {len(res.errors)} errors")  # fmt: skip


if __name__ == "__main__":
    main()
