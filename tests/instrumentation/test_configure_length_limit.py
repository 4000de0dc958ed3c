"""An attribute length limit cuts the SDK's packed lists short: configure says so."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc


def _configure_and_run(caplog: pytest.LogCaptureFixture) -> list[str]:
    exporter = InMemorySpanExporter()
    with caplog.at_level(logging.WARNING, logger="tokentrace"):
        tracing = tt.configure(service_name="limit-test", exporter=exporter)
    try:
        with tt.request(request_id="r") as req:
            for _ in range(40):
                req.token()
        assert tracing.force_flush(5_000)
        (span,) = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_REQUEST]
        offsets = span.attributes[sc.TOKEN_OFFSETS_US]
        assert isinstance(offsets, str)
        return [offsets, *(r.getMessage() for r in caplog.records)]
    finally:
        tt.shutdown()


def test_a_length_limit_is_named_at_configure(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "32")
    offsets, *said = _configure_and_run(caplog)
    assert len(offsets) == 32  # OpenTelemetry cut the packed list: it no longer reads
    with pytest.raises(ValueError):
        sc.unpack_list(offsets)
    assert any("limited to 32 characters" in m for m in said), said


def test_no_limit_no_warning_and_the_list_reads_whole(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", raising=False)
    monkeypatch.delenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", raising=False)
    offsets, *said = _configure_and_run(caplog)
    assert len(sc.unpack_list(offsets)) == 40
    assert not [m for m in said if "limited to" in m]
