"""Forward timing: torch modules and callables, CPU perf_counter path and (GPU-marked) CUDA events."""

from __future__ import annotations

import time

import pytest
import torch

from tokentrace import instrumentation as tt
from tokentrace.analyzer.engine_steps import extract_engine_steps
from tokentrace.collector.otlp import decode_protobuf
from tokentrace.instrumentation import _forward
from tokentrace.instrumentation import semconv as sc

SLEEP_S = 0.005


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(SLEEP_S)  # a forward with a known minimum duration
        return self.lin(x)


def test_module_forward_times_land_on_the_request(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    model = Tiny()
    x = torch.ones(2, 8)
    expected = model(x)
    assert tt.instrument_model(model) is model
    assert tt.instrument_model(model) is model  # guard: no double wrapping
    with tt.request():
        for _ in range(3):
            out = model(x)
    torch.testing.assert_close(out, expected)
    span = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert span.attributes[sc.FORWARD_COUNT] == 3
    assert span.attributes[sc.FORWARD_HOST_US] >= 3 * SLEEP_S * 1e6
    assert sc.FORWARD_GPU_US not in span.attributes  # CPU: no device time is claimed
    tt.uninstrument_model(model)
    with tt.request():
        model(x)
    assert sc.FORWARD_COUNT not in memory_sdk.spans(sc.SPAN_REQUEST)[1].attributes


def test_callable_inside_engine_step_adds_to_the_step(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    def decode_fn(n: int) -> int:
        time.sleep(SLEEP_S)
        return n + 1

    timed = tt.instrument_model(decode_fn, name="decode")
    assert tt.instrument_model(timed) is timed
    with tt.engine_step(queue_depth=1) as step:
        step.decode("r1")
        assert timed(1) == 2
    assert timed(5) == 6  # outside step and request: untimed pass-through
    span = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)[0]
    (host_us,) = sc.unpack_list(span.attributes[sc.STEP_FORWARD_HOST_US])
    assert host_us >= SLEEP_S * 1e6
    steps = extract_engine_steps(decode_protobuf(memory_sdk.otlp_bytes()))
    assert steps[0].gpu_us is None  # no CUDA here


def test_user_exceptions_pass_through_and_still_count(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    class Oom(RuntimeError):
        pass

    def fails() -> None:
        raise Oom("out of memory")

    timed = tt.instrument_model(fails)
    with pytest.raises(Oom, match="out of memory"), tt.request():
        timed()
    span = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert span.attributes[sc.FORWARD_COUNT] == 1
    assert not span.status.is_ok


def test_refuses_non_callables() -> None:
    with pytest.raises(TypeError, match="callable"):
        tt.instrument_model(3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_time_the_forward_without_sync(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    x = torch.randn(256, 2048, device="cuda")
    tt.instrument_model(model)
    model(x)
    torch.cuda.synchronize()
    outer = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with tt.request():
        outer[0].record()
        for _ in range(20):
            out = model(x)
        outer[1].record()
        out.sum().item()  # the server reads its tokens: the GPU work is done before finish
        with tt.engine_step() as step:
            step.decode("r")
            model(x)
    torch.cuda.synchronize()
    span = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert span.attributes[sc.FORWARD_COUNT] == 20
    gpu_us = span.attributes[sc.FORWARD_GPU_US]
    whole_us = outer[0].elapsed_time(outer[1]) * 1000
    # the per-forward event pairs cover the same stream work as one outer pair
    assert 0.8 * whole_us <= gpu_us <= 1.05 * whole_us
    steps = extract_engine_steps(decode_protobuf(memory_sdk.otlp_bytes()))
    assert steps[0].gpu_us is not None and steps[0].gpu_us > 0
    assert _forward.timer._created <= _forward.EVENT_POOL_SIZE
    assert not _forward.timer._inflight
