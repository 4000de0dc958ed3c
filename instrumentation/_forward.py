"""Forward-pass timing: CUDA events read by a worker, perf_counter on CPU.

On CUDA each timed call records a pair of `torch.cuda.Event(enable_timing=True)`
on the current stream and hands the pair to a daemon worker; the worker reads
`elapsed_time` only after both events' `query()` is true, so the hot path never
synchronizes.  Pairs come from a bounded pool; when it is empty the call is
timed on the host only.  Host time (perf_counter around the call: Python,
launch, any implicit sync) and device time are kept apart: their gap is the
launch / sync overhead.  torch is imported lazily, never at SDK import.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from tokentrace.instrumentation._runtime import runtime
from tokentrace.instrumentation._safety import log_once
from tokentrace.instrumentation._tally import DeviceTally

#: Event pairs in flight at most; beyond it calls are timed on the host only.
EVENT_POOL_SIZE = 512
_WORKER_POLL_S = 0.002
#: Calls between two checks of where a model runs: one moved to or from the
#: GPU after `instrument_model` is timed the old way for at most this many.
DEVICE_CHECK_EVERY = 256
#: An instrumented module's `__dict__` entry saying how (a `_ModuleTiming`).
_ATTR_STATE = "_tokentrace_forward"
#: What `instrument_model` puts in a module's `__dict__`: left out of its pickled
#: or copied state (`_getstate`), taken out again by `uninstrument_model`.
_SDK_KEYS = frozenset(
    ("forward", "__getstate__", "__deepcopy__", "_replicate_for_data_parallel", _ATTR_STATE)
)


class DeviceTimer:
    """The CUDA event pool and the worker that reads finished pairs."""

    def __init__(self, pool_size: int = EVENT_POOL_SIZE) -> None:
        self._free: deque[tuple[Any, Any]] = deque()
        self._created = 0
        self._pool_size = pool_size
        self._inflight: deque[tuple[Any, Any, DeviceTally]] = deque()
        self._resolve_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.exhausted = 0

    # ---- hot path ---------------------------------------------------------
    def acquire(self) -> tuple[Any, Any] | None:
        """Gives a free event pair, or None when the pool is exhausted."""
        try:
            return self._free.pop()
        except IndexError:
            pass
        if self._created >= self._pool_size:
            self.exhausted += 1
            return None
        import torch

        self._created += 1
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def submit(self, start: Any, end: Any, tally: DeviceTally) -> None:
        self._inflight.append((start, end, tally))
        if self._thread is None:
            self._start()
        self._wake.set()

    # ---- worker -----------------------------------------------------------
    def _start(self) -> None:
        with self._resolve_lock:
            if self._thread is None:
                t = threading.Thread(target=self._run, name="tokentrace-cuda-timer", daemon=True)
                self._thread = t
                t.start()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                while self._inflight:
                    self.poll()
                    if self._inflight:
                        time.sleep(_WORKER_POLL_S)
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once("CUDA event timing", exc)

    def poll(self) -> int:
        """Resolves every pair whose events are both done (non-blocking); gives the count."""
        resolved = 0
        with self._resolve_lock:
            for _ in range(len(self._inflight)):
                start, end, tally = self._inflight.popleft()
                if start.query() and end.query():
                    tally.fwd_device_ns += int(start.elapsed_time(end) * 1_000_000)
                    tally.fwd_resolved += 1
                    self._free.append((start, end))
                    resolved += 1
                else:
                    self._inflight.append((start, end, tally))  # streams finish out of order
        return resolved

    def after_fork(self) -> None:
        """In a forked child: new locks (another thread may have held them at the fork),
        no worker (it was the parent's thread), and none of the parent's events (CUDA
        is not usable in a forked child; its requests are the parent's)."""
        self._resolve_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._inflight = deque()
        self._free = deque()
        self._created = 0

    def flush(self) -> None:
        """Cold path (shutdown / force_flush): waits for in-flight events, then reads them."""
        if not self._inflight:
            return
        with self._resolve_lock:
            for _start, end, _tally in list(self._inflight):
                end.synchronize()
        self.poll()


timer = DeviceTimer()
runtime.add_flush_hook(timer.flush)
runtime.on_fork_in_child(timer.after_fork)


def poll_device_timings() -> int:
    """Resolves finished CUDA timings now, without waiting; gives how many."""
    if not timer._inflight:
        return 0
    try:
        return timer.poll()
    except Exception as exc:
        log_once("CUDA event timing", exc)
        return 0


_owner_getters: list[Callable[[], Any]] = []


def _bind_owner_getters() -> None:
    # bound on first `instrument_model`: those modules import this one
    from tokentrace.instrumentation._request import _current
    from tokentrace.instrumentation._steps import _current_step

    _owner_getters.extend((_current_step.get, _current.get))


def _first_parameter(model: Any) -> Any:
    try:
        return next(iter(model.parameters()), None)
    except Exception:
        return None


def _compiling_check() -> Callable[[], bool] | None:
    """`torch.compiler.is_compiling` where torch is loaded (None elsewhere: a plain
    callable of a host without torch).

    A timed forward that `torch.compile` traces (the model instrumented, then
    compiled) must be the bare forward: dynamo cannot trace the timing (context
    variables, clocks, CUDA events), and failing there breaks `fullgraph=True` and
    makes the default mode run the whole model uncompiled.  Inside a compiled graph
    a forward is therefore not timed; `instrument_model(torch.compile(model))` times
    each compiled call (docs/sdk.md)."""
    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None)
    return getattr(compiler, "is_compiling", None)


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a CUDA graph: recording a timing
    event there is an error, and a captured forward runs later, in `replay()`."""
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


def _make_timed(
    fn: Callable[..., Any],
    on_cuda: Callable[[], bool],
    module_ref: weakref.ReferenceType[Any] | None = None,
) -> Callable[..., Any]:
    """Gives `fn` timed; with `module_ref`, `fn` is a module class's forward function
    and each call runs it on the module the weak reference gives (see `_instrument_module`)."""
    perf = time.perf_counter_ns
    checks_left = 0
    cuda = False
    if not _owner_getters:
        _bind_owner_getters()
    # the contextvars' own `get`s, in the closure: one C call each on the hot path
    get_step, get_request = _owner_getters
    compiling = _compiling_check()

    if module_ref is None:

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if compiling is not None and compiling():
                return fn(*args, **kwargs)  # traced by torch.compile: see _compiling_check
            try:
                # the engine step, else the request, running in this context owns the
                # time and is its tally (inline: every Python call costs ~1 µs right
                # after a forward)
                tally: DeviceTally | None = get_step() or get_request()
                pair = None
                if tally is not None:
                    nonlocal checks_left, cuda
                    if checks_left <= 0:  # the device, every DEVICE_CHECK_EVERY calls:
                        cuda = on_cuda()  # asking torch costs more than the rest here
                        checks_left = DEVICE_CHECK_EVERY
                    checks_left -= 1
                    if cuda:
                        if _capturing():
                            tally = None  # a CUDA graph's capture: nothing runs yet
                        else:
                            pair = timer.acquire()
                if pair is not None:
                    import torch

                    stream = torch.cuda.current_stream()
                    pair[0].record(stream)
            except Exception as exc:
                log_once("forward timing (start)", exc)
                tally = pair = None
            if tally is None:
                return fn(*args, **kwargs)
            t0 = perf()
            try:
                return fn(*args, **kwargs)  # the user's exceptions pass through unchanged
            finally:
                host = perf() - t0
                try:
                    tally.fwd_count += 1
                    tally.fwd_host_ns += host
                    if pair is not None:
                        pair[1].record(stream)
                        tally.fwd_launched += 1
                        timer.submit(pair[0], pair[1], tally)
                except Exception as exc:
                    log_once("forward timing (end)", exc)

        return timed

    ref = module_ref

    # The same, for a module: the module comes from a weak reference, so that its
    # own `__dict__` holding this does not make a reference cycle (`del model`
    # frees it, and its GPU memory, at once rather than at the next full GC).
    @functools.wraps(fn)
    def timed_module(*args: Any, **kwargs: Any) -> Any:
        module = ref()
        if module is None:
            _module_gone(fn)
        if compiling is not None and compiling():
            return fn(module, *args, **kwargs)  # traced by torch.compile: see _compiling_check
        try:
            tally: DeviceTally | None = get_step() or get_request()
            pair = None
            if tally is not None:
                nonlocal checks_left, cuda
                if checks_left <= 0:
                    cuda = on_cuda()
                    checks_left = DEVICE_CHECK_EVERY
                checks_left -= 1
                if cuda:
                    if _capturing():
                        tally = None  # a CUDA graph's capture: nothing runs yet
                    else:
                        pair = timer.acquire()
            if pair is not None:
                import torch

                stream = torch.cuda.current_stream()
                pair[0].record(stream)
        except Exception as exc:
            log_once("forward timing (start)", exc)
            tally = pair = None
        if tally is None:
            return fn(module, *args, **kwargs)
        t0 = perf()
        try:
            return fn(module, *args, **kwargs)  # the user's exceptions pass through unchanged
        finally:
            host = perf() - t0
            try:
                tally.fwd_count += 1
                tally.fwd_host_ns += host
                if pair is not None:
                    pair[1].record(stream)
                    tally.fwd_launched += 1
                    timer.submit(pair[0], pair[1], tally)
            except Exception as exc:
                log_once("forward timing (end)", exc)

    return timed_module


def _module_gone(fn: Any) -> None:
    raise ReferenceError(
        f"tokentrace: the module of this instrumented {getattr(fn, '__qualname__', 'forward')} "
        "was freed (a module's timed `forward` holds it weakly: keep the module, "
        "not only its `forward`)"
    )


class _ModuleTiming:
    """What `instrument_model` did to a module (its `__dict__[_ATTR_STATE]`)."""

    __slots__ = ("name", "replaced", "timed")

    def __init__(self, name: str, replaced: Any, timed: Callable[..., Any]) -> None:
        self.name = name
        #: the module's own `forward` instance attribute it replaced (`_ABSENT`: none)
        self.replaced = replaced
        self.timed = timed


class _Absent:
    """No `forward` instance attribute: one object, which copies give as itself."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "_ABSENT"


_ABSENT = _Absent()


def _getstate(ref: weakref.ReferenceType[Any]) -> Any:
    """An instrumented module's `__getstate__` (pickle, `torch.save`, `copy`): its state
    as if it were not instrumented, so that it loads where tokentrace is not installed."""
    module = ref()
    cls_getstate = getattr(type(module), "__getstate__", None)
    state = module.__dict__.copy() if cls_getstate is None else cls_getstate(module)
    try:
        timing = state.get(_ATTR_STATE) if isinstance(state, dict) else None
        if isinstance(timing, _ModuleTiming):
            forward = state.get("forward")
            state = {k: v for k, v in state.items() if k not in _SDK_KEYS}
            if forward is not timing.timed:
                state["forward"] = forward  # another library's, set after: theirs to keep
            elif timing.replaced is not _ABSENT:
                state["forward"] = timing.replaced
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("instrumented module's state", exc)
    return state


def _deepcopy(ref: weakref.ReferenceType[Any], memo: dict[int, Any]) -> Any:
    """An instrumented module's `__deepcopy__`: a copy of it not instrumented
    (`_getstate`), then instrumented on its own: the copy (an EMA or draft model,
    a quantized copy) runs its own weights and times itself."""
    module = ref()
    timing = module.__dict__.get(_ATTR_STATE)
    # the host's errors (an attribute that cannot be copied) pass through unchanged
    own_deepcopy = getattr(type(module), "__deepcopy__", None)
    if own_deepcopy is not None:  # the class's own, which this entry hides: it copies
        dup = own_deepcopy(module, memo)
    else:
        rv = module.__reduce_ex__(4)
        if isinstance(rv, str):
            return module  # a global: as `copy.deepcopy` does
        # `copy`'s own reconstruction, as `copy.deepcopy` does after `__reduce_ex__`
        dup = copy._reconstruct(module, memo, *rv)  # type: ignore[attr-defined]
    try:
        if dup is not module:
            copied = getattr(dup, "__dict__", {}).get(_ATTR_STATE)
            if isinstance(copied, _ModuleTiming):  # the class's copy took the entries along
                _strip(dup.__dict__, copied)
            name = timing.name if isinstance(timing, _ModuleTiming) else "forward"
            _instrument_module(dup, name)
    except Exception as exc:  # the copy runs untimed
        log_once("instrumenting a deep copy of an instrumented module", exc)
    return dup


def _replicate(ref: weakref.ReferenceType[Any]) -> Any:
    """An instrumented module's `_replicate_for_data_parallel` (`nn.DataParallel`'s
    per-device replicas): torch's copies the module's `__dict__`, so a replica's
    `forward` would be the original's timed one and run the original's weights on the
    replica's device; instead the replica is instrumented on its own."""
    module: Any = ref()  # alive: it is the module being replicated
    replica = type(module)._replicate_for_data_parallel(module)
    timing = replica.__dict__.get(_ATTR_STATE)
    if isinstance(timing, _ModuleTiming):
        _strip(replica.__dict__, timing)  # dict operations: the replica is plain now
        try:
            _instrument_module(replica, timing.name)
        except Exception as exc:  # the SDK's own failure: the replica runs untimed
            log_once("instrumenting a DataParallel replica", exc)
    return replica


def _strip(d: dict[str, Any], timing: _ModuleTiming) -> None:
    """Takes `instrument_model`'s entries out of a module's `__dict__`."""
    for key in _SDK_KEYS:
        d.pop(key, None)
    if timing.replaced is not _ABSENT:
        d["forward"] = timing.replaced  # the module's own forward attribute, as it was


def _instrument_module(module: Any, name: str) -> Any:
    d = module.__dict__
    if _ATTR_STATE in d:
        return module  # already instrumented
    replaced = d.get("forward", _ABSENT)
    ref = weakref.ref(module)

    def on_cuda() -> bool:
        # read through the module (every DEVICE_CHECK_EVERY calls): a parameter
        # replaced since, or a module moved, is seen
        m = ref()
        p = None if m is None else _first_parameter(m)
        return bool(p is not None and p.is_cuda)

    bound = module.forward
    if replaced is _ABSENT and isinstance(bound, types.MethodType) and bound.__self__ is module:
        # the class's forward, run on the module the weak reference gives
        timed = _make_timed(bound.__func__, on_cuda, ref)
        try:
            # `__wrapped__` is the class's function (with `self`): say the bound
            # method's signature, which libraries inspect (accepted keyword arguments)
            timed.__signature__ = inspect.signature(bound)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass  # no signature to say (a builtin): as `inspect` would find none
    else:
        # the module's own `forward` attribute (another library's wrapper), or
        # an unusual descriptor: timed as the callable it is
        timed = _make_timed(bound, on_cuda)
    d[_ATTR_STATE] = _ModuleTiming(name, replaced, timed)
    d["forward"] = timed
    d["__getstate__"] = functools.partial(_getstate, ref)
    d["__deepcopy__"] = functools.partial(_deepcopy, ref)
    d["_replicate_for_data_parallel"] = functools.partial(_replicate, ref)
    return module


def instrument_model(model_or_callable: Any, name: str = "forward") -> Any:
    """Times every call of a torch module (patched `forward`, same object back) or callable.

    Inside `engine_step()` the time goes to the step, else to the current
    request (`tokentrace.forward.host_us` / `gpu_us` / `count` on its span);
    outside both the call runs untimed.  `name` is for the reader only.

    A module's timed `forward` holds the module weakly (no reference cycle);
    a deep copy of it is instrumented on its own; pickling it (`torch.save`)
    saves it as if it were not instrumented.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model_or_callable, torch.nn.Module):
        return _instrument_module(model_or_callable, name)
    if not callable(model_or_callable):
        raise TypeError(
            f"instrument_model needs a torch.nn.Module or a callable, not {type(model_or_callable)!r}"
        )
    if getattr(model_or_callable, "__tokentrace_timed__", False):
        return model_or_callable

    def cuda_in_use() -> bool:
        # A plain callable gives no device; CUDA events time whatever ran on
        # the current stream, so use them once the process has set CUDA up.
        t = sys.modules.get("torch")
        return bool(t is not None and t.cuda.is_initialized())

    timed = _make_timed(model_or_callable, cuda_in_use)
    if isinstance(model_or_callable, types.MethodType):
        # `model.prefill = tt.instrument_model(model.prefill)`: the timed method becomes
        # an attribute of its own instance, which must still copy and save as one
        return _TimedMethod(model_or_callable, timed, name)
    timed.__tokentrace_timed__ = True  # type: ignore[attr-defined]
    timed.__tokentrace_name__ = name  # type: ignore[attr-defined]
    return timed


class _TimedMethod:
    """A bound method timed by `instrument_model`, that copies and pickles as the method does.

    Assigned back to its instance (`model.prefill = tt.instrument_model(model.prefill)`),
    a plain timed function would stay bound to the original: a deep copy of the model
    (an EMA or draft model) would silently run the original's weights, and pickling
    (`torch.save`) would fail on the function.  Python deep-copies a bound method by
    deep-copying its instance; so does this, timed again on the copy.  Pickled, it is
    the plain bound method (loading needs no tokentrace).
    """

    __tokentrace_timed__ = True
    __wrapped__: types.MethodType  # set by `functools.update_wrapper`

    def __init__(self, method: types.MethodType, timed: Callable[..., Any], name: str) -> None:
        functools.update_wrapper(self, method)  # __wrapped__, __name__, __doc__: as the method
        self._timed = timed
        self.__tokentrace_name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(*args, **kwargs)

    @property
    def __self__(self) -> Any:
        return self.__wrapped__.__self__

    @property
    def __func__(self) -> Any:
        return self.__wrapped__.__func__

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        method = self.__wrapped__
        # copying the instance that holds this, the copy is in `memo` already
        owner = copy.deepcopy(method.__self__, memo)
        if owner is method.__self__:  # a class, a module: copied as itself
            return self
        return instrument_model(types.MethodType(method.__func__, owner), self.__tokentrace_name__)

    def __copy__(self) -> _TimedMethod:
        return self

    def __reduce__(self) -> Any:
        return self.__wrapped__.__reduce__()  # `getattr(instance, name)`: the method, untimed

    def __repr__(self) -> str:
        return f"<timed {self.__wrapped__!r}>"


def uninstrument_model(model_or_callable: Any) -> Any:
    """Undoes `instrument_model`: gives the module with its own forward, or the original callable."""
    d = getattr(model_or_callable, "__dict__", {})
    timing = d.get(_ATTR_STATE)
    if isinstance(timing, _ModuleTiming):
        if d.get("forward") is not timing.timed:
            # another library wrapped the timed forward since: taking it out would
            # take theirs out too (an offloading hook, say)
            log_once(
                "uninstrument_model: the module's forward was replaced after instrument_model",
                detail=" (left instrumented)",
            )
            return model_or_callable
        _strip(d, timing)
        return model_or_callable
    return getattr(model_or_callable, "__wrapped__", model_or_callable)
