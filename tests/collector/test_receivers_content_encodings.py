"""OTLP/HTTP bodies in every Content-Encoding a sender offers: gzip (OTLP's own), deflate
(the OpenTelemetry SDKs' other choice; zlib-wrapped, or raw as some clients send it) and
zstd (the OpenTelemetry Collector's), each bounded after decompression like gzip; the
encodings it does not take get a 415 that names those it does."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import zstandard
from collector_testkit import LiveCollector, start_live
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from otlp_traces import request_trace, to_json, to_protobuf

from tokentrace.collector.content_encoding import BodyError, decompress

PB = {"Content-Type": "application/x-protobuf"}
MiB = 1024 * 1024


def _raw_deflate(body: bytes) -> bytes:
    d = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return d.compress(body) + d.flush()


def _zstd_frames(body: bytes) -> bytes:
    """Two frames, the second without its size (a streaming writer's): both are read."""
    half = len(body) // 2
    stream = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    return (
        zstandard.ZstdCompressor().compress(body[:half])
        + stream.compress(body[half:])
        + stream.flush()
    )


ENCODINGS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "x-gzip": ("x-gzip", gzip.compress),
    "deflate (zlib, RFC 9110)": ("deflate", zlib.compress),
    "deflate (raw)": ("deflate", _raw_deflate),
    "zstd": ("zstd", zstandard.ZstdCompressor().compress),
    "zstd (two frames)": ("zstd", _zstd_frames),
}


@pytest.mark.slow
@pytest.mark.parametrize("content_type", ["protobuf", "json"])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_each_encoding_lands_the_export(name: str, content_type: str, live: LiveCollector) -> None:
    coding, compress = ENCODINGS[name]
    spans = request_trace()
    if content_type == "json":
        import json

        body, ctype = json.dumps(to_json(spans)).encode(), "application/json"
    else:
        body, ctype = to_protobuf(spans).SerializeToString(), PB["Content-Type"]
    r = httpx.post(
        f"{live.http}/v1/traces",
        content=compress(body),
        headers={"Content-Type": ctype, "Content-Encoding": coding},
    )
    assert r.status_code == 200, r.content
    assert live.rows("SELECT trace_id FROM requests") == [(spans[0].trace_id,)]


@pytest.mark.slow
def test_the_sdk_exporter_with_deflate_lands_its_spans(live: LiveCollector) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{live.http}/v1/traces", compression=Compression.Deflate)
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("vllm.tracing").start_as_current_span(
        "llm_request", kind=SpanKind.SERVER
    ) as span:
        span.set_attribute("gen_ai.request.model", "opt-125m")
        span.set_attribute("gen_ai.latency.e2e", 0.5)
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    assert live.rows("SELECT model FROM requests WHERE trace_id = ?", [trace_id]) == [("opt-125m",)]


BOMBS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "deflate": ("deflate", zlib.compress),
    "deflate (raw)": ("deflate", _raw_deflate),
    # without the size in its header: only decoding finds how big it is
    "zstd": ("zstd", zstandard.ZstdCompressor(write_content_size=False).compress),
    "zstd (size in its header)": ("zstd", zstandard.ZstdCompressor().compress),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BOMBS))
def test_a_body_that_decompresses_past_the_bound_is_413(name: str, tmp_path: Path) -> None:
    coding, compress = BOMBS[name]
    live, stop = start_live(tmp_path, max_body_bytes=MiB)
    try:
        bomb = compress(b"\0" * (64 * MiB))  # a few KB on the wire
        assert len(bomb) < MiB
        r = httpx.post(
            f"{live.http}/v1/traces", content=bomb, headers={**PB, "Content-Encoding": coding}
        )
        assert r.status_code == 413
        assert Status.FromString(r.content).message == f"decompressed body exceeds {MiB} bytes"
        # within the bound, the same coding is taken
        ok = compress(to_protobuf(request_trace()).SerializeToString())
        r = httpx.post(
            f"{live.http}/v1/traces", content=ok, headers={**PB, "Content-Encoding": coding}
        )
        assert r.status_code == 200
    finally:
        stop()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BOMBS))
def test_decompressing_a_bomb_holds_about_the_bound(name: str) -> None:
    coding, compress = BOMBS[name]
    bomb = compress(b"\0" * (256 * MiB))
    limit = 4 * MiB
    tracemalloc.start()
    try:
        with pytest.raises(BodyError) as refused:
            decompress(bomb, "gzip" if coding == "x-gzip" else coding, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.status == 413
    # a small multiple of the bound (a chunk and the output it joins), never the 256 MiB
    assert peak < 3 * limit, f"{peak / MiB:.1f} MiB held to refuse a {limit / MiB:.0f} MiB bound"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("coding", "body", "says"),
    [
        ("zstd", b"not zstd at all", "invalid zstd body"),
        ("zstd", zstandard.ZstdCompressor().compress(b"x" * 100_000)[:-8], "truncated zstd body"),
        (
            "zstd",
            zstandard.ZstdCompressor().compress(b"x" * 1000) + b"trailing",
            "invalid zstd body",
        ),
        ("deflate", b"not deflate", "invalid deflate body"),
        ("deflate", zlib.compress(b"x" * 100_000)[:-8], "truncated deflate body"),
        ("deflate", zlib.compress(b"x" * 1000) + b"trailing", "data after the deflate stream"),
    ],
    ids=[
        "zstd-garbage",
        "zstd-truncated",
        "zstd-trailing",
        "deflate-garbage",
        "deflate-truncated",
        "deflate-trailing",
    ],
)
def test_a_body_not_in_its_encoding_is_400(
    coding: str, body: bytes, says: str, live: LiveCollector
) -> None:
    r = httpx.post(
        f"{live.http}/v1/traces", content=body, headers={**PB, "Content-Encoding": coding}
    )
    assert r.status_code == 400
    assert Status.FromString(r.content).message.startswith(says)


@pytest.mark.parametrize("coding", ["snappy", "lz4", "br"])
@pytest.mark.parametrize("content_type", ["application/x-protobuf", "application/json"])
def test_an_encoding_not_taken_is_415_naming_those_taken(
    coding: str, content_type: str, live: LiveCollector
) -> None:
    r = httpx.post(
        f"{live.http}/v1/traces",
        content=b"\x00\x01",
        headers={"Content-Type": content_type, "Content-Encoding": coding},
    )
    assert r.status_code == 415
    if content_type == "application/json":
        message = r.json()["message"]
    else:
        message = Status.FromString(r.content).message
    assert coding in message
    for taken in ("gzip", "deflate", "zstd"):
        assert taken in message
