"""GPU sampler: injected fake NVML backend, OTLP metrics export, request GPU summaries; real NVML on GPUs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tt_testkit import OtlpHttpSink

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _gpu, _safety
from tokentrace.instrumentation import semconv as sc
from tokentrace.store.connection import open_read_only

GIB = 1 << 30


class FakeNvml:
    """Two GPUs whose utilization steps 10, 20, 30 … per read."""

    def __init__(self) -> None:
        self.reads = 0
        self.closed = False

    def device_count(self) -> int:
        return 2

    def read(self, index: int) -> _gpu.GpuReading:
        self.reads += 1
        return _gpu.GpuReading(
            10.0 * self.reads, (index + 1) * GIB + self.reads, 80 * GIB, 1410.0, 250.5
        )

    def close(self) -> None:
        self.closed = True


class MetricsReceiver(OtlpHttpSink):
    """An OTLP/HTTP metrics endpoint on 127.0.0.1 that keeps what it is sent."""

    def __init__(self) -> None:
        super().__init__(paths=("/v1/metrics",))

    @property
    def requests(self) -> list[ExportMetricsServiceRequest]:
        return [ExportMetricsServiceRequest.FromString(b) for b in self.bodies("/v1/metrics")]


@pytest.fixture
def receiver() -> Iterator[MetricsReceiver]:
    r = MetricsReceiver()
    tt.configure(endpoint=r.url, service_name="gpu-test", exporter=InMemorySpanExporter())
    yield r
    tt.shutdown()
    r.close()


@pytest.mark.slow
def test_samples_ship_as_otlp_gauges_with_their_own_timestamps(receiver) -> None:  # type: ignore[no-untyped-def]
    backend = FakeNvml()
    sampler = _gpu.GpuSampler(backend, interval_s=0.01, export=False)
    sampler.sample_once()
    time.sleep(0.002)
    sampler.sample_once()
    assert sampler.export_now() == 4
    assert sampler.export_now() == 0  # nothing queued twice
    (body,) = receiver.requests
    rm = body.resource_metrics[0]
    assert {kv.key: kv.value.string_value for kv in rm.resource.attributes}[
        "service.name"
    ] == "gpu-test"
    metrics = {m.name: m for m in rm.scope_metrics[0].metrics}
    assert set(metrics) == {sc.METRIC_GPU_UTIL, sc.METRIC_GPU_MEM_USED, sc.METRIC_GPU_MEM_TOTAL,
                            sc.METRIC_GPU_SM_CLOCK, sc.METRIC_GPU_POWER}  # fmt: skip
    util = metrics[sc.METRIC_GPU_UTIL].gauge.data_points
    assert [p.as_double for p in util] == [10.0, 20.0, 30.0, 40.0]
    assert [p.attributes[0].value.int_value for p in util] == [0, 1, 0, 1]
    assert util[0].time_unix_nano == util[1].time_unix_nano < util[2].time_unix_nano
    mem = metrics[sc.METRIC_GPU_MEM_USED].gauge.data_points
    assert mem[1].as_int == 2 * GIB + 2
    sampler.stop()
    assert backend.closed


@pytest.mark.slow
def test_running_sampler_exports_and_summarizes_requests(receiver) -> None:  # type: ignore[no-untyped-def]
    backend = FakeNvml()
    sampler = tt.start_gpu_sampler(interval_s=0.01, backend=backend, export_interval_s=0.05)
    try:
        assert sampler.running
        with tt.request() as req:
            deadline = time.monotonic() + 10
            while backend.reads < 10 and time.monotonic() < deadline:
                time.sleep(0.01)
        exporter = (
            tt.get_tracing().provider._active_span_processor._span_processors[0].span_exporter
        )
        assert tt.get_tracing().force_flush()
    finally:
        sampler.stop()
    assert not sampler.running and backend.closed
    span = next(s for s in exporter.get_finished_spans() if s.name == sc.SPAN_REQUEST)
    assert span.attributes[sc.GPU_UTIL_MEAN] > 0
    assert span.attributes[sc.GPU_MEM_MAX_BYTES] >= 2 * GIB
    assert req.request_id == span.attributes[sc.REQUEST_ID]
    points = sum(
        len(m.gauge.data_points)
        for b in receiver.requests
        for m in b.resource_metrics[0].scope_metrics[0].metrics
        if m.name == sc.METRIC_GPU_UTIL
    )
    assert points == sampler.samples_taken == sampler.samples_exported


@pytest.mark.slow
def test_stop_right_after_a_request_keeps_its_gpu_summary(receiver) -> None:  # type: ignore[no-untyped-def]
    # The usual shutdown order: the last request ends, the sampler stops, then
    # tt.shutdown().  The request's span is built by the finisher thread later,
    # after the sampler and its samples are gone, unless stop() builds it first.
    backend = FakeNvml()
    sampler = tt.start_gpu_sampler(interval_s=0.01, backend=backend, export=False)
    with tt.request():
        deadline = time.monotonic() + 10
        while backend.reads < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    sampler.stop()
    assert tt.get_tracing().force_flush()
    exporter = tt.get_tracing().provider._active_span_processor._span_processors[0].span_exporter
    span = next(s for s in exporter.get_finished_spans() if s.name == sc.SPAN_REQUEST)
    assert span.attributes[sc.GPU_UTIL_MEAN] > 0


def test_missing_nvidia_ml_py_is_a_warning_with_the_extra_to_install(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    sampler = tt.start_gpu_sampler()
    assert not sampler.running
    (record,) = [r for r in caplog.records if "GPU sampler off" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert "tokentrace[gpu]" in record.getMessage()


def test_summary_covers_only_the_window() -> None:
    sampler = _gpu.GpuSampler(FakeNvml(), export=False)
    sampler.sample_once()  # utils 10, 20
    mid = time.time_ns()
    time.sleep(0.002)
    sampler.sample_once()  # utils 30, 40
    summary = sampler.summary(mid, time.time_ns())
    assert summary == {sc.GPU_UTIL_MEAN: 35.0, sc.GPU_MEM_MAX_BYTES: 2 * GIB + 4}
    assert sampler.summary(0, 1) is None


@pytest.mark.slow
def test_broken_backend_is_logged_once_and_never_raises(receiver, caplog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # log_once's sites are once per process: an earlier failure at this site (another
    # test's, or this one run again) would leave nothing to log here
    monkeypatch.setattr(_safety, "_seen", set())

    class Broken(FakeNvml):
        def read(self, index: int) -> _gpu.GpuReading:
            self.reads += 1
            raise OSError("NVML_ERROR_GPU_IS_LOST")

    backend = Broken()
    sampler = tt.start_gpu_sampler(interval_s=0.005, backend=backend)
    # several failed reads, however late a loaded machine runs the sampler thread (a fixed
    # 0.1 s could hold none: nothing logged)
    deadline = time.monotonic() + 10
    while backend.reads < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert backend.reads >= 5
    assert sum("NVML sampling" in r.getMessage() for r in caplog.records) == 1


def test_without_nvml_the_sampler_stays_off() -> None:
    try:
        _gpu.NvmlBackend().close()
        pytest.skip("NVML works here")
    except Exception:
        pass
    sampler = tt.start_gpu_sampler()
    assert not sampler.running
    assert _gpu.gpu_summary(0, time.time_ns()) is None
    sampler.stop()


def test_samples_reach_serve_gpu_samples(serve_sdk) -> None:  # type: ignore[no-untyped-def]
    serve, tracing = serve_sdk
    sampler = _gpu.GpuSampler(FakeNvml(), export=False)
    sampler.sample_once()
    sampler.sample_once()
    assert sampler.export_now() == 4, "the collector's /v1/metrics refused the samples"
    serve.stop()
    conn = open_read_only(serve.db)
    try:
        rows = conn.execute(
            "SELECT service, gpu_index, utilization_pct, memory_used_bytes, memory_total_bytes, sm_clock_mhz, power_w "
            "FROM gpu_samples ORDER BY ts_ns, gpu_index"
        ).fetchall()
    finally:
        conn.close()
    assert [r[:3] for r in rows] == [("sdk-e2e", 0, 10.0), ("sdk-e2e", 1, 20.0), ("sdk-e2e", 0, 30.0),
                                     ("sdk-e2e", 1, 40.0)]  # fmt: skip
    assert rows[0][3:] == (GIB + 1, 80 * GIB, 1410.0, 250.5)


@pytest.mark.slow
@pytest.mark.gpu
def test_real_nvml_samples_this_machine(receiver) -> None:  # type: ignore[no-untyped-def]
    try:
        backend = _gpu.NvmlBackend()
    except Exception as exc:
        pytest.skip(f"no NVML: {exc}")
    if backend.device_count() == 0:
        pytest.skip("no GPU")
    sampler = tt.start_gpu_sampler(interval_s=0.02, backend=backend, export_interval_s=0.1)
    deadline = time.monotonic() + 10  # (a fixed 0.3 s could hold fewer than two samples)
    while sampler.samples_taken < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    assert sampler.samples_taken >= 2 and sampler.samples_exported == sampler.samples_taken
    metrics = {
        m.name: m for b in receiver.requests for m in b.resource_metrics[0].scope_metrics[0].metrics
    }
    total = metrics[sc.METRIC_GPU_MEM_TOTAL].gauge.data_points[0].as_int
    assert total > GIB
