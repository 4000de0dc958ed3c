"""An instrumented module copied, pickled, saved, dropped: its copies run their own weights."""

from __future__ import annotations

import copy
import gc
import inspect
import io
import pickle
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest
import torch

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(2, 2, bias=False)
        self.head = torch.nn.Linear(2, 2, bias=False)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return self.head(self.inner(x)) * scale


@pytest.fixture
def gc_off() -> Iterator[None]:
    """Only reference counting frees: what a reference cycle would keep alive shows."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _zero(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()


def test_a_deep_copy_runs_its_own_weights_and_times_itself(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    model = tt.instrument_model(Net())
    x = torch.ones(1, 2)
    expected = model(x)
    ema = copy.deepcopy(model)  # an EMA / draft model, a quantized copy
    _zero(ema)
    torch.testing.assert_close(ema(x), torch.zeros(1, 2))  # its own (zeroed) weights
    torch.testing.assert_close(model(x), expected)  # the original: untouched
    with tt.request():
        ema(x)
        ema(x)
        model(x)
    span = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert span.attributes[sc.FORWARD_COUNT] == 3  # the copy's calls are timed too
    tt.uninstrument_model(ema)
    assert "forward" not in ema.__dict__
    torch.testing.assert_close(ema(x), torch.zeros(1, 2))


def test_an_instrumented_submodule_of_a_deep_copy_is_the_copys_own() -> None:
    model = Net()
    tt.instrument_model(model.inner)
    x = torch.ones(1, 2)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        draft.inner.weight.zero_()
    torch.testing.assert_close(draft(x), torch.zeros(1, 2))
    assert model(x).abs().sum() > 0


def test_pickle_and_torch_save_give_the_module_as_if_not_instrumented() -> None:
    model = tt.instrument_model(Net(), name="decode")
    x = torch.ones(1, 2)
    expected = model(x)
    for blob in (pickle.dumps(model), _torch_saved(model)):
        assert b"tokentrace" not in blob  # loads where tokentrace is not installed
    loaded = pickle.loads(pickle.dumps(model))
    assert "forward" not in loaded.__dict__
    _zero(loaded)
    torch.testing.assert_close(loaded(x), torch.zeros(1, 2))
    torch.testing.assert_close(model(x), expected)
    assert "forward" in model.__dict__  # saving left the original instrumented
    reloaded = torch.load(io.BytesIO(_torch_saved(model)), weights_only=False)
    torch.testing.assert_close(reloaded(x), expected)


def _torch_saved(model: torch.nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.save(model, buf)
    return buf.getvalue()


@pytest.mark.slow
def test_a_saved_module_loads_without_tokentrace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "model.pt"
    torch.save(tt.instrument_model(torch.nn.Linear(2, 2)), path)
    code = (
        "import sys; sys.modules['tokentrace'] = None\n"  # `import tokentrace` fails
        "import torch\n"
        f"m = torch.load({str(path)!r}, weights_only=False)\n"
        "print(tuple(m(torch.ones(1, 2)).shape))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(1, 2)"


@pytest.mark.usefixtures("gc_off")
def test_dropping_an_instrumented_module_frees_it_at_once(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    model = tt.instrument_model(torch.nn.Linear(64, 64))
    with tt.request():
        model(torch.ones(1, 64))
    freed_module, freed_weight = weakref.ref(model), weakref.ref(model.weight)
    del model
    assert freed_module() is None  # no reference cycle: no wait for a full GC
    assert freed_weight() is None


def test_uninstrument_restores_the_modules_dict_exactly() -> None:
    model = Net()
    before = dict(model.__dict__)
    tt.instrument_model(model)
    assert tt.instrument_model(model) is model
    tt.uninstrument_model(model)
    assert model.__dict__ == before
    assert model.forward.__func__ is Net.forward  # type: ignore[attr-defined]


def test_a_forward_set_on_the_instance_is_timed_and_restored(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Linear(2, 2)
    calls = []

    def own_forward(x: torch.Tensor) -> torch.Tensor:  # another library's wrapper
        calls.append(1)
        return x

    model.forward = own_forward  # type: ignore[method-assign]
    tt.instrument_model(model)
    with tt.request():
        model(torch.ones(1, 2))
    assert calls == [1]
    assert memory_sdk.spans(sc.SPAN_REQUEST)[0].attributes[sc.FORWARD_COUNT] == 1
    tt.uninstrument_model(model)
    assert model.__dict__["forward"] is own_forward


def test_the_timed_forward_keeps_the_modules_signature() -> None:
    model = Net()
    plain = inspect.signature(model.forward)
    tt.instrument_model(model)
    assert inspect.signature(model.forward) == plain
    assert model.forward.__name__ == "forward"


def test_a_kept_forward_of_a_freed_module_says_so() -> None:
    forward = tt.instrument_model(torch.nn.Linear(2, 2)).forward
    gc.collect()
    with pytest.raises(ReferenceError, match="was freed"):
        forward(torch.ones(1, 2))


def test_uninstrument_leaves_a_forward_wrapped_on_top_alone() -> None:
    model = tt.instrument_model(torch.nn.Linear(2, 2))
    timed = model.forward

    def offload_hook(*args: object, **kwargs: object) -> object:  # set after, by another library
        return timed(*args, **kwargs)

    model.forward = offload_hook  # type: ignore[method-assign]
    tt.uninstrument_model(model)
    assert model.__dict__["forward"] is offload_hook  # theirs: still there, still working
    model(torch.ones(1, 2))


class OwnCopy(Net):
    def __deepcopy__(self, memo: dict[int, object]) -> OwnCopy:  # a class that copies itself
        dup = type(self).__new__(type(self))
        memo[id(self)] = dup
        dup.__dict__.update(copy.deepcopy(self.__dict__, memo))
        dup.copied_by_its_class = True
        return dup


def test_a_class_with_its_own_deepcopy_still_makes_the_copy() -> None:
    model = tt.instrument_model(OwnCopy())
    x = torch.ones(1, 2)
    draft = copy.deepcopy(model)
    assert draft.copied_by_its_class
    _zero(draft)
    torch.testing.assert_close(draft(x), torch.zeros(1, 2))
    assert model(x).abs().sum() > 0
    tt.uninstrument_model(draft)
    assert "forward" not in draft.__dict__
