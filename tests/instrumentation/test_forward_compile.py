"""Forward timing meets torch.compile and CUDA graphs: the host's model still compiles
(and captures), unchanged, and is timed where a call really runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


class GraphCounter:
    """A torch.compile backend that runs each graph eagerly and counts them: a frame
    dynamo gave up on (and ran uncompiled) makes no graph."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.graphs += 1
        return gm.forward


@pytest.mark.slow
@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "default"])
def test_instrumented_then_compiled_model_compiles_whole(memory_sdk, fullgraph: bool) -> None:  # type: ignore[no-untyped-def]
    """Instrumented, then compiled: dynamo traces the timed forward. It must see the bare
    forward: fullgraph=True raised on the timing, and the default mode silently ran
    the whole model uncompiled."""
    torch._dynamo.reset()
    model = _model()
    x = torch.randn(2, 8)
    expected = model(x)
    tt.instrument_model(model)
    backend = GraphCounter()
    compiled = torch.compile(model, backend=backend, fullgraph=fullgraph)
    with tt.request():
        for _ in range(3):
            out = compiled(x)
    torch.testing.assert_close(out, expected)
    assert backend.graphs == 1  # one graph, the whole model, no break
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    # inside a compiled graph nothing of ours runs: no forward is timed (not a wrong one)
    assert sc.FORWARD_COUNT not in span.attributes
    # the model called plainly is still timed
    memory_sdk.exporter.clear()
    with tt.request():
        model(x)
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.FORWARD_COUNT] == 1


def test_compiled_then_instrumented_times_each_call(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    model = _model()
    x = torch.randn(2, 8)
    backend = GraphCounter()
    compiled = tt.instrument_model(torch.compile(model, backend=backend, fullgraph=True))
    with tt.request():
        for _ in range(3):
            out = compiled(x)
    torch.testing.assert_close(out, model(x))
    assert backend.graphs == 1
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.FORWARD_COUNT] == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_of_an_instrumented_model(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """Recording a timing event on a capturing stream is a CUDA error: a capture inside
    a request passes the forward through untimed, and replays run as captured."""
    model = _model().cuda()
    tt.instrument_model(model)
    static_x = torch.randn(2, 8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch's docs do
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with tt.request():
        with torch.cuda.graph(graph):
            static_out = model(static_x)
        static_x.copy_(torch.ones(2, 8, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(static_out, model(torch.ones(2, 8, device="cuda")))
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert sc.FORWARD_COUNT not in span.attributes  # the capture ran nothing


def test_data_parallel_replica_runs_its_own_weights_timed(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """`nn.DataParallel` makes per-device replicas with `_replicate_for_data_parallel`,
    which copies the module's `__dict__`: the replica's forward was the original's timed
    one, running the original's weights (on the wrong device, with GPUs)."""
    model = tt.instrument_model(_model())
    replica = model._replicate_for_data_parallel()
    # what `torch.nn.parallel.replicate` does next: the replicas get their own parameters
    # (zeros here: other weights than the original's)
    for name, child in model._modules.items():
        child_replica = child._replicate_for_data_parallel()
        for key, param in child._parameters.items():
            child_replica._parameters[key] = torch.zeros_like(param)
        replica._modules[name] = child_replica
    x = torch.randn(2, 8)
    with tt.request():
        out = replica(x)
    torch.testing.assert_close(out, torch.zeros(2, 4))  # the replica's weights ran
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.FORWARD_COUNT] == 1  # and the replica is timed
    assert tt.uninstrument_model(replica) is replica
    assert "forward" not in vars(replica) and "forward" in vars(model)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_data_parallel_over_two_gpus(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    model = tt.instrument_model(_model().cuda())
    x = torch.randn(8, 8, device="cuda")
    expected = model(x)
    with tt.request():
        out = torch.nn.DataParallel(model)(x)
    torch.testing.assert_close(out, expected)
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.FORWARD_COUNT] >= 2  # one per replica
