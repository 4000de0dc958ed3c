"""What the collector drops is on `/metrics`, scraped from a live collector: engine steps
dropped unread by the caps (also those a decode worker dropped, in its own process),
and rows decided after the DuckDB writer thread stopped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from collector_testkit import start_live
from otlp_traces import request_trace, to_protobuf
from prometheus_client.parser import text_string_to_metric_families
from test_export_caps_steps import _steps_span
from test_writer_stopped import _kill, _one_request, _wait_dead

from tokentrace.analyzer.engine_steps import MAX_STEPS_PER_SPAN

pytestmark = pytest.mark.slow

PB = {"Content-Type": "application/x-protobuf"}


def _counter(live: Any, name: str) -> float:
    text = httpx.get(f"{live.http}/metrics", timeout=30).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == name]
    assert family.type == "counter"
    (sample,) = family.samples
    return float(sample.value)


def _rows(live: Any, sql: str) -> Any:
    return live.rows(sql)


@pytest.mark.parametrize("offload", [True, False], ids=["decode-worker", "in-process"])
def test_steps_past_a_batch_spans_cap_are_counted_on_metrics(tmp_path: Path, offload: bool) -> None:
    live, stop = start_live(tmp_path, offload=offload)
    try:
        before = _counter(live, "tokentrace_engine_steps_dropped")
        over = 904
        body = to_protobuf([_steps_span(MAX_STEPS_PER_SPAN + over)]).SerializeToString()
        r = httpx.post(f"{live.http}/v1/traces", content=body, headers=PB, timeout=60)
        assert r.status_code == 200, r.text
        if offload:
            assert live.decoder is not None and live.decoder.offloaded == 1
        deadline = time.monotonic() + 20
        while not _rows(live, "SELECT count(*) FROM engine_steps")[0][0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _rows(live, "SELECT count(*) FROM engine_steps") == [(MAX_STEPS_PER_SPAN,)]
        assert _counter(live, "tokentrace_engine_steps_dropped") - before == over
    finally:
        stop()


def test_rows_decided_after_the_writer_stopped_are_counted_on_metrics(tmp_path: Path) -> None:
    live, stop = start_live(tmp_path, grace_s=0.2)
    try:
        writer = live.collector.writer
        pipeline = live.collector.pipeline
        assert _counter(live, "tokentrace_rows_lost") == 0
        # the decider waits (its lock held) until the writer thread has stopped: a trace it
        # decided before would be written, not lost, and no grace is long enough for the
        # posts of a loaded machine (1.5 s was not)
        with pipeline._decide_lock:
            for _ in range(3):  # taken while the writer runs; decided after the grace
                body = to_protobuf(request_trace()).SerializeToString()
                assert httpx.post(f"{live.http}/v1/traces", content=body, headers=PB, timeout=30).status_code == 200
            _kill(writer)
            assert writer.submit(_one_request())  # its write ends the thread
            _wait_dead(writer)
        deadline = time.monotonic() + 20
        while pipeline.stats.traces_lost < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pipeline.stats.traces_lost == 3
        assert _counter(live, "tokentrace_rows_lost") == pipeline.stats.rows_lost >= 3
    finally:
        stop()
