"""A GPU sampler left running after `tt.shutdown()` drops its samples without making
anything, at interpreter exit included.

Its exporter asked `get_tracing()` for the configuration, which after `shutdown()`
made one that exports nothing: a `TracerProvider()`, whose `Resource.create` runs its
detectors on a thread pool.  At exit that pool takes no work ("cannot schedule new
futures after interpreter shutdown"), logged as "GPU metrics export failed" (3 of 6
exits over gRPC).  Here the thread pool is put in the state the interpreter's exit
leaves it in.
"""

from __future__ import annotations

import concurrent.futures.thread
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_gpu_sampler import FakeNvml, MetricsReceiver

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _gpu, _safety
from tokentrace.instrumentation._runtime import State, runtime


@pytest.fixture
def receiver() -> Iterator[MetricsReceiver]:
    r = MetricsReceiver()
    yield r
    r.close()


def _pool_refuses_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """As after the interpreter began its exit: new futures are refused."""
    monkeypatch.setattr(concurrent.futures.thread, "_shutdown", True)
    with pytest.raises(RuntimeError, match="interpreter shutdown"):
        concurrent.futures.ThreadPoolExecutor(1).submit(int)


@pytest.mark.slow
def test_samples_after_shutdown_are_dropped_without_making_a_configuration(  # type: ignore[no-untyped-def]
    receiver, monkeypatch, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="tokentrace")
    monkeypatch.setattr(_safety, "_seen", set())
    tt.configure(endpoint=receiver.url, service_name="gpu-exit", exporter=InMemorySpanExporter())
    sampler = _gpu.GpuSampler(FakeNvml(), 0.01, export=False)
    sampler.sample_once()
    assert sampler.export_now() == 2  # configured: they leave
    sampler.sample_once()
    tt.shutdown()
    _pool_refuses_work(monkeypatch)
    assert sampler.export_now() == 0
    assert sampler.samples_dropped == 2
    assert sampler.export_failures == 0
    assert runtime.state is State.SHUT_DOWN
    assert runtime._after_shutdown is None  # nothing was made for them
    assert not [r for r in caplog.records if "GPU metrics export" in r.getMessage()]
    assert len(receiver.requests) == 1


def test_the_configuration_after_shutdown_needs_no_thread_pool(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What a request that ends after `shutdown()` gets: made without `Resource.create`."""
    monkeypatch.setattr(_safety, "_seen", set())
    tt.configure(service_name="after-shutdown", exporter=InMemorySpanExporter())
    tt.shutdown()
    _pool_refuses_work(monkeypatch)
    tracing = tt.get_tracing()
    assert tracing.settings.disabled
    assert tracing is tt.get_tracing()  # made once
