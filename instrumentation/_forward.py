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

import functools
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tokentrace.instrumentation._config import add_flush_hook
from tokentrace.instrumentation._safety import log_once
from tokentrace.instrumentation._tally import DeviceTally

#: Event pairs in flight at most; beyond it calls are timed on the host only.
EVENT_POOL_SIZE = 512
_WORKER_POLL_S = 0.002
#: Calls between two checks of where a model runs: one moved to or from the
#: GPU after `instrument_model` is timed the old way for at most this many.
DEVICE_CHECK_EVERY = 256
_ATTR_ORIGINAL = "_tokentrace_original_forward"


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

    def flush(self) -> None:
        """Cold path (shutdown / force_flush): waits for in-flight events, then reads them."""
        if not self._inflight:
            return
        with self._resolve_lock:
            for _start, end, _tally in list(self._inflight):
                end.synchronize()
        self.poll()


timer = DeviceTimer()
add_flush_hook(timer.flush)


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
    # bound on first use: those modules import this one.  The contextvars'
    # own `get`: one C call each on the forward's hot path
    from tokentrace.instrumentation._request import _current
    from tokentrace.instrumentation._steps import _current_step

    _owner_getters.extend((_current_step.get, _current.get))


def _first_parameter(model: Any) -> Any:
    try:
        return next(iter(model.parameters()), None)
    except Exception:
        return None


def _make_timed(fn: Callable[..., Any], on_cuda: Callable[[], bool]) -> Callable[..., Any]:
    perf = time.perf_counter_ns
    checks_left = 0
    cuda = False

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        try:
            # the engine step, else the request, running in this context owns the
            # time and is its tally (inline: every Python call costs ~1 µs right
            # after a forward)
            if not _owner_getters:
                _bind_owner_getters()
            tally: DeviceTally | None = _owner_getters[0]() or _owner_getters[1]()
            pair = None
            if tally is not None:
                nonlocal checks_left, cuda
                if checks_left <= 0:  # the device, every DEVICE_CHECK_EVERY calls:
                    cuda = on_cuda()  # asking torch costs more than the rest here
                    checks_left = DEVICE_CHECK_EVERY
                checks_left -= 1
                if cuda:
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


def instrument_model(model_or_callable: Any, name: str = "forward") -> Any:
    """Times every call of a torch module (patched `forward`, same object back) or callable.

    Inside `engine_step()` the time goes to the step, else to the current
    request (`tokentrace.forward.host_us` / `gpu_us` / `count` on its span);
    outside both the call runs untimed.  `name` is for the reader only.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model_or_callable, torch.nn.Module):
        module = model_or_callable
        if _ATTR_ORIGINAL in module.__dict__:
            return module  # already instrumented
        original = module.forward
        param_holder = [_first_parameter(module)]

        def on_cuda() -> bool:
            p = param_holder[0]
            return bool(p is not None and p.is_cuda)

        module.__dict__[_ATTR_ORIGINAL] = original
        module.forward = _make_timed(original, on_cuda)
        module._tokentrace_forward_name = name
        return module
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
    timed.__tokentrace_timed__ = True  # type: ignore[attr-defined]
    timed.__tokentrace_name__ = name  # type: ignore[attr-defined]
    return timed


def uninstrument_model(model_or_callable: Any) -> Any:
    """Undoes `instrument_model`: gives the module with its own forward, or the original callable."""
    d = getattr(model_or_callable, "__dict__", {})
    if _ATTR_ORIGINAL in d:
        del d[_ATTR_ORIGINAL]
        d.pop("forward", None)
        d.pop("_tokentrace_forward_name", None)
        return model_or_callable
    return getattr(model_or_callable, "__wrapped__", model_or_callable)
