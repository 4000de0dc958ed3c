"""Engine steps: one record per continuous-batching scheduler iteration.

Recording a step is an append of one tuple to a bounded deque; a daemon
flusher turns batches of steps into `tokentrace.engine.steps` spans whose
attributes are parallel lists (`semconv.STEP_*`, each packed as one string).
Each batch span is its own root (its own trace): steps serve many requests and
belong to none of them.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind

from tokentrace.instrumentation import semconv
from tokentrace.instrumentation._background import QueueFlusher
from tokentrace.instrumentation._forward import poll_device_timings
from tokentrace.instrumentation._runtime import runtime
from tokentrace.instrumentation._safety import log_once
from tokentrace.instrumentation._tally import DeviceTally

if TYPE_CHECKING:
    from tokentrace.instrumentation._request import TokenBatch

#: Steps kept waiting for export; beyond it the oldest are dropped (and counted).
MAX_PENDING_STEPS = 65_536
#: Most steps per emitted span: keeps the time the flusher holds the GIL building
#: one short (see `flush`).
MAX_STEPS_PER_SPAN = 512
#: Most characters of request ids in one emitted span (the bulk of its size): a span
#: of 512 steps of 256 sequences each named 3 MB of ids, over the 4 MiB that OTLP
#: receivers take by default (the OpenTelemetry Collector's gRPC); more are split.
MAX_SPAN_REQUEST_ID_CHARS = 256 * 1024
#: The flusher wakes early once this many steps wait.
WAKE_AT_STEPS = 2_048
FLUSH_INTERVAL_S = 1.0
#: How long a step waits for its CUDA timings before it is sent with gpu_us unknown.
DEVICE_WAIT_NS = 2_000_000_000

# (start_ns, end_ns, prefill_tokens, decode_seqs, batch_size, queue_depth,
#  request_ids, kv_usage, gpu_us, tally), from `record_step`.  An `EngineStep`
# is queued itself and read by the flusher (`EngineStep.record`): its raw
# request-id list (batch_size 0, kv_usage possibly None); de-duplicating,
# joining and converting are the flusher's work, not the scheduler's.  A count
# given as None is unknown: sent as -1.
_StepRecord = tuple[
    int, int, int | None, int | None, int | None, int | None, str | list[str], float | None,
    int, DeviceTally | None,
]
_time_ns = time.time_ns
_monotonic_ns = time.monotonic_ns

_current_step: contextvars.ContextVar[EngineStep | None] = contextvars.ContextVar(
    "tokentrace_engine_step", default=None
)


class StepRecorder(QueueFlusher["_StepRecord | EngineStep"]):
    """The bounded step buffer (the oldest steps go first) and its daemon flusher thread.

    It holds `EngineStep` objects as they exited (the record is read from them
    here, not built on the scheduler's thread) and `record_step` tuples.
    """

    def __init__(
        self, flush_interval_s: float = FLUSH_INTERVAL_S, max_pending: int = MAX_PENDING_STEPS
    ) -> None:
        super().__init__(
            "tokentrace-steps",
            flush_interval_s,
            max_pending,
            wake_at=WAKE_AT_STEPS,
            drop_oldest=True,
        )
        self.emitted_spans = 0

    #: the hot path: one step queued (a step is never refused: the oldest make room)
    append = QueueFlusher.offer

    def flush(self, final: bool = True) -> int:
        """Emits every buffered step as `tokentrace.engine.steps` spans; gives the count.

        Steps whose CUDA timings are still running wait (up to DEVICE_WAIT_NS)
        unless `final`, where they go with gpu_us unknown.
        """
        with self._flush_lock:
            if not self._items:
                return 0
            poll_device_timings()
            batch: list[_StepRecord] = []
            now = time.time_ns()
            # what waits now, not what steps recorded meanwhile add: under a steady load
            # "until empty" never ended, and a force_flush() or shutdown() waited on it
            for _ in range(len(self._items)):
                item = self._items.popleft()
                rec = item.record() if isinstance(item, EngineStep) else item
                tally = rec[9]
                if (
                    not final
                    and tally is not None
                    and not tally.fwd_complete
                    and now - rec[1] < DEVICE_WAIT_NS
                ):
                    self._items.appendleft(item)  # keep order: later steps wait too
                    break
                batch.append(rec)
            if runtime.get_tracing().settings.disabled:
                return len(batch)  # nothing is exported: no spans built for nothing
            for i in range(0, len(batch), MAX_STEPS_PER_SPAN):
                self._emit(batch[i : i + MAX_STEPS_PER_SPAN])
                if not final:
                    self._yield_gil()
            return len(batch)

    def _emit(self, batch: list[_StepRecord]) -> None:
        starts = [r[0] for r in batch]
        ends = [r[1] for r in batch]
        if not (
            _only_ints(starts)
            and _only_ints(ends)
            and min(starts) >= _MIN_EPOCH_NS
            and min(ends) >= _MIN_EPOCH_NS
        ):
            # a step with no usable time cannot be placed: dropped, and counted
            timed = [r for r in map(_with_epoch_times, batch) if r is not None]
            self.dropped += len(batch) - len(timed)
            if not timed:
                return
            batch = timed
            starts = [r[0] for r in batch]
            ends = [r[1] for r in batch]
        tracer = runtime.get_tracing().tracer
        gpu_us: list[int] = []
        fwd_host_us: list[int] = []
        batch_size: list[int | None] = []
        request_ids: list[str] = []
        kv_usage: list[float] = []
        for rec in batch:
            ids = rec[6]
            # from EngineStep: a raw list, where a chunked prefill may name one request twice
            if isinstance(ids, list):
                unique = list(dict.fromkeys(ids))
                batch_size.append(len(unique))
                try:
                    request_ids.append(_checked_ids(",".join(unique), unique))
                except TypeError:  # ids that are not strings (ints, UUIDs): as text
                    request_ids.append(_joined_ids(unique))
            else:
                batch_size.append(rec[4])
                request_ids.append(ids)
            kv_usage.append(_kv(rec[7]))
            tally = rec[9]
            if tally is not None:
                fwd_host_us.append(tally.fwd_host_ns // 1000)
                known = tally.fwd_launched and tally.fwd_complete
                gpu_us.append(tally.fwd_device_ns // 1000 if known else rec[8])
            else:
                fwd_host_us.append(-1)
                gpu_us.append(rec[8])
        if len(batch) > 1 and sum(map(len, request_ids)) > MAX_SPAN_REQUEST_ID_CHARS:
            # big batches stepping fast: two spans of half the steps each, as often as it takes
            half = len(batch) // 2
            self._emit(batch[:half])
            self._emit(batch[half:])
            return
        pack = semconv.pack_list  # one string per list: see semconv.PACKED_LISTS
        attrs: dict[str, Any] = {
            semconv.STEP_COUNT: len(batch),
            semconv.STEP_START_NS: pack(starts),
            semconv.STEP_DURATION_US: pack(
                [(e - s) // 1000 for s, e in zip(starts, ends, strict=True)]
            ),
            # a count not given (None) or no number is sent as -1: unknown, not 0
            semconv.STEP_PREFILL_TOKENS: pack(_ints([r[2] for r in batch], "prefill tokens", -1)),
            semconv.STEP_DECODE_SEQS: pack(_ints([r[3] for r in batch], "decode_seqs", -1)),
            semconv.STEP_BATCH_SIZE: pack(_ints(batch_size, "batch_size", -1)),
            semconv.STEP_QUEUE_DEPTH: pack(_ints([r[5] for r in batch], "queue_depth", -1)),
            semconv.STEP_REQUEST_IDS: pack(request_ids),
            semconv.STEP_KV_USAGE: pack(kv_usage),
            semconv.STEP_GPU_US: pack(_ints(gpu_us, "gpu_us", -1)),
            semconv.STEP_FORWARD_HOST_US: pack(fwd_host_us),
        }
        if self.dropped:
            attrs[semconv.STEP_DROPPED] = self.dropped
            self.dropped = 0
        span = tracer.start_span(
            semconv.SPAN_ENGINE_STEPS,
            context=otel_context.Context(),  # empty context: a new root, its own trace
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            start_time=min(starts),
        )
        span.end(end_time=max(ends))
        self.emitted_spans += 1


_INT_ONLY = frozenset((int,))
_INF = float("inf")
#: 2001-09-09 in `time.time_ns()`: a step time under it is no wall-clock nanosecond
_MIN_EPOCH_NS = 10**18
#: `time.time()` seconds from 2001 to 2103 (a monotonic clock's nanoseconds are
#: in this range only in the first four seconds after boot)
_SECONDS_FROM, _SECONDS_UNTIL = 1e9, 4.2e9


def _only_ints(values: list[Any]) -> bool:
    """Whether every value is a plain int (the usual case: one C-speed pass)."""
    return set(map(type, values)) <= _INT_ONLY


def _to_int(value: Any, field: str, unknown: int) -> int:
    """Gives `value` as an int (a count handed over as "3" or 3.0), `unknown` when it is
    None (not given: no word logged) or no number."""
    if value is None:
        return unknown
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # that field is lost, not the step
        log_once(f"engine step: {field} is not a number", detail=f" ({value!r}; sent as {unknown})")
        return unknown


def _ints(values: list[Any], field: str, unknown: int) -> list[Any]:
    """Gives `values` as plain ints, converting only where the host handed over something else."""
    if _only_ints(values):
        return values
    return [_to_int(v, field, unknown) for v in values]


def _epoch_ns(value: Any) -> int | None:
    """Gives a step time as `time.time_ns()` nanoseconds; None when it cannot be one.

    `time.time()` seconds (from 2001 to 2103) are read as seconds: an easy
    slip that would otherwise put the step in January 1970.  Anything
    else under 2001 in nanoseconds (a monotonic clock, milliseconds) has no
    place on the wall clock the requests are on.
    """
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if number >= _MIN_EPOCH_NS and number != _INF:
        try:
            return int(value)  # exact for ints and integer strings
        except (TypeError, ValueError):
            return int(number)
    if _SECONDS_FROM <= number < _SECONDS_UNTIL:
        log_once(
            "engine step: start_ns / end_ns given in seconds (time.time()), not time.time_ns()",
            detail=f" ({value!r}: read as seconds)",
        )
        return round(number * 1e9)
    return None


def _with_epoch_times(rec: _StepRecord) -> _StepRecord | None:
    """Gives `rec` with `time.time_ns()` start and end times, or None (logged once) when it has none."""
    start, end = _epoch_ns(rec[0]), _epoch_ns(rec[1])
    if start is None or end is None:
        log_once(
            "engine step: start_ns / end_ns is not a time.time_ns() wall-clock time",
            detail=f" ({rec[0]!r}, {rec[1]!r}: not a number, or a monotonic clock or another unit; "
            f"the step is dropped, counted in {semconv.STEP_DROPPED})",
        )
        return None
    return (start, end, *rec[2:])  # type: ignore[return-value]


def _kv(value: float | None) -> float:
    """Gives a KV-cache usage as a float, -1.0 when unknown or not a number."""
    if value is None:
        return -1.0
    try:
        usage = float(value)
    except (TypeError, ValueError):  # a bad value loses that field, not the step
        log_once("engine step: kv_usage is not a number", detail=f" ({value!r}; sent as -1)")
        return -1.0
    if usage != usage or usage in (_INF, -_INF):  # NaN / inf: no JSON number, no usage
        log_once("engine step: kv_usage is not finite", detail=f" ({usage}; sent as -1)")
        return -1.0
    if 0.0 <= usage <= 1.0:
        return usage
    if 1.0 < usage <= 100.0:  # a percent where a fraction belongs: it would read as a full cache
        log_once(
            "engine step: kv_usage is the used fraction of the KV cache, 0 to 1",
            detail=f" ({usage}: read as a percent)",
        )
        return usage / 100.0
    log_once("engine step: kv_usage is outside 0 to 1", detail=f" ({usage}; sent as -1)")
    return -1.0


recorder = StepRecorder()
runtime.add_flush_hook(lambda: recorder.flush())  # late-bound: tests swap the recorder


class EngineStep(DeviceTally):
    """One scheduler iteration: use as a context manager around the step's work.

    It is the tally of the forward passes run inside it (`instrument_model`).
    """

    __slots__ = (
        "queue_depth",
        "kv_usage",
        "prefill_tokens",
        "prefill_seqs",
        "request_ids",
        "tokens",
        "start_ns",
        "end_ns",
        "_ctx_token",
    )

    def __init__(
        self,
        *,
        queue_depth: int | None = None,
        kv_usage: float | None = None,
        decode: Iterable[str] = (),
        tokens: TokenBatch | None = None,
    ) -> None:
        self.queue_depth = queue_depth
        self.kv_usage = kv_usage
        self.prefill_tokens = 0
        self.prefill_seqs = 0
        #: `decode`: the ids of the requests decoding one token in this step, given
        #: at once (a scheduler has that list): no call per request on the hot path
        if decode.__class__ is str:  # one id, not its characters (~30 ns a step)
            self.request_ids: list[str] = _decode_ids(decode)
        else:
            try:  # free when nothing is raised (Python 3.11+): no check on the usual path
                self.request_ids = list(decode)
            except TypeError:
                self.request_ids = _decode_ids(decode)
        #: `tokens`: every request of this batch got one output token when the step ended
        self.tokens = tokens
        # the forward passes run inside this step (`instrument_model` adds to them);
        # zeroed here (DeviceTally has no __init__): no extra call on the hot path
        self.fwd_count = self.fwd_launched = self.fwd_host_ns = 0
        self.fwd_resolved = self.fwd_device_ns = 0
        self.start_ns = self.end_ns = 0
        self._ctx_token: contextvars.Token[EngineStep | None] | None = None

    def prefill(self, request_id: str, tokens: int) -> None:
        """Records that this step prefilled `tokens` prompt tokens of `request_id`."""
        try:
            self.prefill_tokens += tokens
        except TypeError:  # a count handed over as a string: converted off the usual path
            self.prefill_tokens += _to_int(tokens, "prefill tokens", 0)
        self.prefill_seqs += 1
        self.request_ids.append(request_id)

    def decode(self, request_id: str) -> None:
        """Records that this step decoded one token of `request_id`."""
        self.request_ids.append(request_id)  # decode_seqs is counted at exit: one append here

    def decode_many(self, request_ids: Iterable[str]) -> None:
        """Records that this step decoded one token of each of `request_ids` (one call a batch)."""
        if request_ids.__class__ is str:  # one id, not its characters
            self.request_ids.extend(_decode_ids(request_ids))
            return
        try:
            self.request_ids.extend(request_ids)
        except TypeError:  # None, or one id: off the usual path
            self.request_ids.extend(_decode_ids(request_ids))

    def __enter__(self) -> EngineStep:
        self._ctx_token = _current_step.set(self)
        self.start_ns = _time_ns()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        # Hot path: the step itself is queued; the flusher reads its record
        # (`record`), de-duplicates and joins the ids.
        self.end_ns = _time_ns()
        batch = self.tokens
        if batch is not None:
            try:
                batch._times.append(_monotonic_ns())  # requests' token times: their clock
            except AttributeError:  # not a TokenBatch; free when nothing is raised (3.11+)
                _tokens_of_non_batch(batch)
        token = self._ctx_token
        if token is not None:
            _current_step.reset(token)
            self._ctx_token = None
        r = recorder
        items = r._items
        if r._thread is not None and len(items) < r._wake_at:
            items.append(self)  # the common case, inline: a call costs ~1 µs after a forward
        else:
            r.append(self)  # start the flusher, wake it, or make room

    def record(self) -> _StepRecord:
        """Gives this step's record, as the flusher reads it once the step has exited."""
        ids = self.request_ids
        return (
            self.start_ns,
            self.end_ns,
            self.prefill_tokens,
            len(ids) - self.prefill_seqs,
            0,
            self.queue_depth,
            ids,
            self.kv_usage,
            -1,
            self if self.fwd_count else None,
        )


def _decode_ids(decode: Any) -> list[Any]:
    """Gives the decoding ids of `engine_step(decode=...)` when they are not an iterable."""
    if decode is None:  # "nobody decodes this step", as a scheduler may well say it
        return []
    log_once(
        f"engine_step(decode=...) / decode_many() take an iterable of request ids, not "
        f"{type(decode).__name__}"
        " (taken as one id)"
    )
    return [decode]


def _tokens_of_non_batch(tokens: Any) -> None:
    """Records the step's tokens for `engine_step(tokens=...)` given requests, not a TokenBatch."""
    from tokentrace.instrumentation._request import RequestTrace, record_tokens

    what = f"engine_step(tokens=...) takes a tt.TokenBatch, not {type(tokens).__name__}"
    try:
        members = list(tokens)
    except TypeError:
        members = []
    requests = [m for m in members if isinstance(m, RequestTrace)]
    record_tokens(requests)  # one token each, the slower way
    if requests and len(requests) == len(members):
        log_once(f"{what} (recorded per request, the slower way)")
    else:
        log_once(f"{what} of requests (the step's tokens are not recorded but for requests in it)")


#: `with tt.engine_step(queue_depth=..., kv_usage=..., decode=ids) as step:`
#: records one continuous-batching step when the block exits.  The class itself, not a
#: factory function: one Python call less on every step.
engine_step = EngineStep


def current_step() -> EngineStep | None:
    """Gives the engine step running in this context, if any."""
    return _current_step.get()


def _escaped_id(request_id: str) -> str:
    """An id as a step's id list carries it: its "," (the list's separator) and "%"
    percent-encoded (the analyzer decodes them: analyzer/engine_steps.py)."""
    return request_id.replace("%", "%25").replace(",", "%2C")


def _checked_ids(joined: str, request_ids: Any) -> str:
    """Gives `joined` (`request_ids` joined by ","), or the ids escaped where one holds a
    "," or a "%" (a request "a,b" read as the two requests "a" and "b")."""
    try:
        n = len(request_ids)
    except TypeError:  # an iterator, consumed by the join: its ids as joined
        return joined
    if "%" not in joined and joined.count(",") == n - 1:
        return joined
    return ",".join([_escaped_id(rid) for rid in request_ids])


def _joined_ids(request_ids: Any) -> str:
    """Gives `record_step`'s request ids joined by "," when they are not all strings."""
    if request_ids is None:
        return ""
    try:
        return ",".join([_escaped_id(str(rid)) for rid in request_ids])
    except TypeError:  # one id, not a sequence of them
        return _escaped_id(str(request_ids))


def record_step(
    *,
    start_ns: int,
    end_ns: int,
    prefill_tokens: int | None,
    decode_seqs: int | None,
    batch_size: int | None,
    queue_depth: int | None,
    request_ids: Sequence[str] = (),
    kv_usage: float | None = None,
    gpu_us: int | None = None,
) -> None:
    """Records one step measured by the caller (times from `time.time_ns()`); an append.

    The values are checked and converted by the flusher, off the caller's
    thread: one that is not a number is logged once and sent as unknown, as is a
    count given as None (the engine does not know it).
    """
    if request_ids.__class__ is str:
        ids = request_ids  # one id (or ids already joined by ","), not its characters
        if "%" in ids:
            ids = ids.replace("%", "%25")
    else:
        try:
            ids = ",".join(request_ids)
        except TypeError:  # ids that are not strings, or None: as text
            ids = _joined_ids(request_ids)
        else:
            if "," in ids or "%" in ids:
                ids = _checked_ids(ids, request_ids)
    recorder.append(
        (
            start_ns,
            end_ns,
            prefill_tokens,
            decode_seqs,
            batch_size,
            queue_depth,
            ids,
            kv_usage,
            -1 if gpu_us is None else gpu_us,
            None,
        )
    )
