"""The collector's Prometheus self-metrics as a scraper sees them: a live
collector, `GET /metrics` over HTTP, parsed with prometheus_client's parser."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from otlp_traces import new_id, request_trace, to_protobuf
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tokentrace import __version__
from tokentrace.collector import self_metrics
from tokentrace.collector.settings import CollectorSettings
from tokentrace.serve import CollectorServer

PB = {"Content-Type": "application/x-protobuf"}
#: the cap on `model` label values (getattr: the test must run against code without one)
CAP: int = getattr(self_metrics, "MAX_MODEL_LABELS", 50)


def _scrape(live: Any) -> dict[str, Any]:
    r = httpx.get(f"{live.http}/metrics")
    assert r.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def _samples(families: dict[str, Any]) -> list[Sample]:
    return [s for f in families.values() for s in f.samples]


def _value(
    families: dict[str, Any], family: str, sample: str | None = None, **labels: str
) -> float:
    (value,) = [
        s.value for s in families[family].samples
        if s.name == (sample or family) and s.labels == labels
    ]  # fmt: skip
    return value


def _send(live: Any, spans: list[Any]) -> None:
    # (a decode worker starts inside the first export it decodes: over 4 s on a loaded
    # machine, near httpx's default 5 s timeout)
    r = httpx.post(
        f"{live.http}/v1/traces",
        content=to_protobuf(spans).SerializeToString(),
        headers=PB,
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_written_rows_are_counters_named_total(live) -> None:  # type: ignore[no-untyped-def]
    _send(live, request_trace() + request_trace())
    live.settle()
    families = _scrape(live)
    w = live.collector.writer
    for name, total in (
        ("tokentrace_requests_written", w.requests_written),
        ("tokentrace_spans_written", w.spans_written),
        ("tokentrace_write_errors", w.write_errors),
    ):
        assert families[name].type == "counter", name
        assert _value(families, name, f"{name}_total") == total
    assert _value(families, "tokentrace_requests_written", "tokentrace_requests_written_total") == 2
    names = {s.name for s in _samples(families)}
    assert not names & {
        "tokentrace_requests_written",
        "tokentrace_spans_written",
        "tokentrace_write_errors",
    }


def test_help_says_what_is_counted(live) -> None:  # type: ignore[no-untyped-def]
    families = _scrape(live)
    errors = families["tokentrace_write_errors"].documentation
    assert "rows dropped" in errors and "transaction" not in errors
    summarized = families["tokentrace_requests_summarized"].documentation
    assert "made" in summarized and "written" not in summarized


def test_process_python_and_build_info(live) -> None:  # type: ignore[no-untyped-def]
    families = _scrape(live)
    names = {s.name for s in _samples(families)}
    for name in (
        "process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds",
        "process_start_time_seconds", "python_info", "python_gc_collections_total",
    ):  # fmt: skip
        assert name in names, name
    assert families["process_cpu_seconds"].type == "counter"
    assert _value(families, "process_resident_memory_bytes") > 0
    assert _value(families, "tokentrace_build_info", version=__version__) == 1


@pytest.mark.slow
def test_no_created_series(live) -> None:  # type: ignore[no-untyped-def]
    _send(live, request_trace())
    live.settle()
    names = {s.name for s in _samples(_scrape(live))}
    assert "tokentrace_spans_received_total" in names  # counters are there ...
    assert "tokentrace_request_e2e_seconds_count" in names  # ... and histograms
    assert not [n for n in names if n.endswith("_created")]


@pytest.mark.slow
def test_model_label_is_capped(live) -> None:  # type: ignore[no-untyped-def]
    models = [f"model-{new_id(6)}" for _ in range(200)]
    for chunk in range(0, 200, 50):
        _send(live, [s for m in models[chunk : chunk + 50] for s in request_trace(model=m)])
    live.settle()
    families = _scrape(live)
    counts = {
        s.labels["model"]: s.value
        for s in families["tokentrace_request_e2e_seconds"].samples
        if s.name == "tokentrace_request_e2e_seconds_count"
    }
    assert len(counts) <= CAP + 1
    assert "other" in counts
    assert sum(counts.values()) == 200  # nothing lost: the rest is counted under "other"
    assert counts["other"] == 200 - CAP
    overflow = _value(
        families, "tokentrace_model_label_overflow", "tokentrace_model_label_overflow_total"
    )
    assert overflow == 200 - CAP
    for family in families.values():  # every metric with a model label
        values = {s.labels["model"] for s in family.samples if "model" in s.labels}
        assert len(values) <= CAP + 1, family.name
    # a model seen before the cap keeps its own series
    _send(live, request_trace(model=models[0]))
    live.settle()
    after = _scrape(live)
    assert (
        _value(
            after,
            "tokentrace_request_e2e_seconds",
            "tokentrace_request_e2e_seconds_count",
            model=models[0],
        )
        == 2
    )


def test_store_file_sizes_and_writer_capacity(tmp_path: Path) -> None:
    from collector_testkit import start_live

    live, stop = start_live(tmp_path, max_pending_writes=17)
    try:
        _send(live, request_trace())
        live.settle()
        families = _scrape(live)
        db = live.collector.settings.db
        assert families["tokentrace_db_size_bytes"].type == "gauge"
        size = _value(families, "tokentrace_db_size_bytes")
        assert size > 0 and abs(size - db.stat().st_size) < 1 << 20
        wal = Path(f"{db}.wal")  # nothing is written after settle(): the size stays
        assert _value(families, "tokentrace_db_wal_size_bytes") == (
            wal.stat().st_size if wal.exists() else 0
        )
        assert _value(families, "tokentrace_writer_queue_capacity_batches") == 17
        assert families["tokentrace_writer_queue_batches"].type == "gauge"
    finally:
        stop()


@pytest.mark.slow
def test_decode_worker_restarts_are_counted(tmp_path: Path) -> None:
    from collector_testkit import start_live

    live, stop = start_live(tmp_path, offload=True)
    try:
        live.collector.metrics.watch_decoder(live.decoder)  # as CollectorServer does
        spans = [s for _ in range(5) for s in request_trace()]
        _send(live, spans)
        (pid,) = live.decoder.worker_pids()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60  # (a loaded machine's pool may notice it late)
        while not live.decoder.fallbacks and time.monotonic() < deadline:
            _send(live, [s for _ in range(5) for s in request_trace()])  # decoded in-process
            time.sleep(0.05)
        families = _scrape(live)
        assert families["tokentrace_decode_worker_restarts"].type == "counter"
        restarts = "tokentrace_decode_worker_restarts_total"
        assert _value(families, "tokentrace_decode_worker_restarts", restarts) == 1
    finally:
        stop()


def test_collector_server_reports_its_decode_pool(tmp_path: Path) -> None:
    settings = CollectorSettings(
        db=tmp_path / "s.duckdb", http_port=0, grpc_port=0, web_port=0, decode_processes=1
    )
    server = CollectorServer(settings)
    try:
        assert server.decoder is not None
        server.decoder.worker_restarts = 3
        text = server.collector.metrics.render()[0].decode()
        assert "tokentrace_decode_worker_restarts_total 3.0" in text
    finally:
        if server.decoder is not None:
            server.decoder.close()
        server.collector.close()


@pytest.mark.slow
def test_the_tail_buffers_bytes_are_exported(tmp_path: Path) -> None:
    from collector_testkit import start_live

    live, stop = start_live(tmp_path, grace_s=600, max_buffered_bytes=64 << 20)  # nothing decided
    try:
        _send(live, request_trace())
        families = _scrape(live)
        held = _value(families, "tokentrace_buffer_bytes")
        assert held > 0 and held == live.collector.pipeline.buffered_bytes
        assert _value(families, "tokentrace_buffer_capacity_bytes") == 64 << 20
    finally:
        stop()
