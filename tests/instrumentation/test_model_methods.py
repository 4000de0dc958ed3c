"""A bound method timed and set back on its model (`model.prefill = tt.instrument_model(model.prefill)`,
as examples/tiny_llm does): copies of the model run their own weights, and the model saves."""

from __future__ import annotations

import copy
import inspect
import io
import pickle

import torch

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc


class Lm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))

    def prefill(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        """Fills the cache."""
        return x * self.w * scale


def _instrumented() -> Lm:
    model = Lm()
    model.prefill = tt.instrument_model(model.prefill, "prefill")  # type: ignore[method-assign]
    return model


def test_a_deep_copy_runs_its_own_weights_and_times_itself(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    model = _instrumented()
    draft = copy.deepcopy(model)  # a draft or EMA model
    with torch.no_grad():
        draft.w.fill_(5.0)
    x = torch.ones(2)
    with torch.no_grad():
        torch.testing.assert_close(draft.prefill(x), torch.full((2,), 5.0))  # its own weights
        torch.testing.assert_close(model.prefill(x), torch.ones(2))  # the original: untouched
        with tt.request():
            draft.prefill(x)
            draft.prefill(x)
    span = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert span.attributes[sc.FORWARD_COUNT] == 2  # the copy's calls are timed


def test_pickle_and_torch_save_give_the_model_as_if_not_instrumented() -> None:
    model = _instrumented()
    buf = io.BytesIO()
    torch.save(model, buf)
    for blob in (pickle.dumps(model), buf.getvalue()):
        assert b"tokentrace" not in blob  # loads where tokentrace is not installed
    loaded = pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        loaded.w.fill_(3.0)
        torch.testing.assert_close(loaded.prefill(torch.ones(2)), torch.full((2,), 3.0))
    reloaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.prefill(torch.ones(2)), torch.ones(2))


def test_the_timed_method_reads_as_the_method() -> None:
    model = _instrumented()
    timed = model.prefill
    assert inspect.signature(timed) == inspect.signature(Lm().prefill)
    assert timed.__name__ == "prefill" and timed.__doc__ == "Fills the cache."
    assert timed.__self__ is model and timed.__func__ is Lm.prefill
    assert tt.instrument_model(timed) is timed  # once only
    assert tt.uninstrument_model(timed) == Lm.prefill.__get__(model)
    assert copy.copy(timed) is timed


def test_user_exceptions_pass_through(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    model = _instrumented()
    with tt.request():
        try:
            model.prefill("not a tensor")  # type: ignore[arg-type]
        except TypeError as exc:
            assert "tokentrace" not in str(exc)
        else:
            raise AssertionError("the host's TypeError was swallowed")
    assert memory_sdk.spans(sc.SPAN_REQUEST)[0].attributes[sc.FORWARD_COUNT] == 1
