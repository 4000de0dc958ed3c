"""The server-side request span, its phases and its token recorder.

Hot-path cost is kept to appends: `token()` appends one integer, phases append
a tuple, `finish()` queues the request.  Phase spans are created after the
request finishes, with their recorded start and end times, by a daemon thread
(`RequestFinisher`): building spans is OpenTelemetry's costliest part (~8–10 µs
a span, and as much again to encode it) and the host's serving loop should not
pay it.  The token times go as one packed string (`semconv.PACKED_LISTS`).  A
scheduler thread can mark phases of a request it does not hold the context of.
Inside `with tt.request()` the request's span is OpenTelemetry's current span,
so what other code traces there joins the request's trace.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from operator import itemgetter
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokentrace.instrumentation import _cold_start as cold_start
from tokentrace.instrumentation import semconv
from tokentrace.instrumentation._background import QueueFlusher
from tokentrace.instrumentation._errors import record_error
from tokentrace.instrumentation._forward import poll_device_timings
from tokentrace.instrumentation._gpu import gpu_summary
from tokentrace.instrumentation._pending_span import PendingSpan
from tokentrace.instrumentation._runtime import runtime
from tokentrace.instrumentation._safety import count_or_zero, describe, log_once
from tokentrace.instrumentation._tally import DeviceTally

_propagator = TraceContextTextMapPropagator()
_get_current_span = trace.get_current_span
#: the parent of a request that starts a trace of its own (whatever span is current)
_NEW_TRACE = otel_context.Context()
#: held while a request's phase containers are read and swapped (`end_phase`,
#: `_finish_at`): a few times a request, never per token
_phase_lock = threading.Lock()


_current: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar(
    "tokentrace_request", default=None
)
#: what `RequestTrace._activate` gives: the `current_request()` token, and
#: OpenTelemetry's context token (None where its span was not made current)
_Activation = tuple["contextvars.Token[RequestTrace | None]", object]
_ids = itertools.count(1)
_monotonic_ns = time.monotonic_ns  # bound once: token() is the hottest call in the SDK
#: guards making a request's attribute dict and span on first use (host or finisher)
_lazy_lock = threading.Lock()


#: How long a finished request waits, at most, for its spans to be built off the host's thread.
FINISH_INTERVAL_S = 0.5
#: Finished requests waiting at once; beyond it `finish()` builds the spans itself.
MAX_PENDING_FINISHES = 16_384
#: The builder wakes early once this many requests wait.
FINISH_WAKE_AT = 256
#: Most spans one phase name gets in a request.  A phase run more often (a streaming
#: server detokenizes once per token) gets none: the request span carries its number
#: of calls and their summed time instead (`semconv.PHASE_CALLS_SUFFIX`), so a
#: 1000-token answer costs no 1000 spans.  The usual one tokenize and one detokenize
#: stay spans in the waterfall.
PHASE_SPANS_MAX = 4
#: Phases that stay spans however often they run: the scheduler's stages, marked by
#: the host (a few each at most: a chunked prefill, a preempted request queued again),
#: whose span times the analyzer reads (prefill's start is where the prefill bucket
#: starts, the queue spans are its `queue_wait`) and the waterfall shows where they lie.
PHASES_ALWAYS_SPANS = frozenset({"queue", "prefill", "decode"})


_phase_name = itemgetter(0)  # of a recorded phase: (name, start, end)


def _id_prefix() -> str:
    # pid for the reader, random bits so that a restarted process (containers
    # often run as pid 1) or a forked worker never repeats an id
    return f"req-{os.getpid()}-{random.getrandbits(32):08x}-"


_prefix = _id_prefix()


def _new_prefix_after_fork() -> None:
    global _prefix, _ids, _lazy_lock, _phase_lock
    _prefix = _id_prefix()
    _ids = itertools.count(1)
    # another thread may have held them at the fork
    _lazy_lock = threading.Lock()
    _phase_lock = threading.Lock()


runtime.on_fork_in_child(_new_prefix_after_fork)


def _new_request_id() -> str:
    # a prefix drawn once per process and a counter: no formatting on the hot path
    return _prefix + str(next(_ids))


def _id_text(request_id: object) -> str:
    """Gives a request id the host handed over as another type (an int, a UUID) as text."""
    try:
        return str(request_id)
    except Exception:  # its own __str__ failed: the request still gets an id
        log_once(
            "request(request_id=...): the id has no text",
            detail=f" ({type(request_id).__name__}; a generated id is used)",
        )
        return _new_request_id()


def _text_carrier(headers: Mapping[Any, Any]) -> dict[str, str]:
    """Gives `headers` with lower-case text names and text values (W3C propagation needs them)."""

    def text(value: Any) -> str:
        return value.decode("latin-1") if isinstance(value, bytes) else str(value)

    return {text(k).lower(): text(v) for k, v in headers.items()}


def _parent_from_headers(headers: Any) -> otel_context.Context | None:
    """Gives the trace context a W3C `traceparent` in the incoming `headers` continues.

    `headers` is a mapping or (name, value) pairs, names matched case-insensitively
    (HTTP header names are), bytes as raw ASGI headers have them.  Headers that
    cannot be read are the SDK's to log (once): the request starts a new trace.
    """
    try:
        if not headers:
            return None
        carrier = headers if headers.__class__ is dict else dict(headers)
        value = carrier.get("traceparent")
        if value.__class__ is not str:  # not the usual: lower-case text
            if value is None and "HTTP_TRACEPARENT" in carrier:
                # a WSGI environ (PEP 3333: `HTTP_` and the name upper-cased, `_` for `-`)
                wsgi = (("traceparent", "HTTP_TRACEPARENT"), ("tracestate", "HTTP_TRACESTATE"))
                carrier = {
                    name: carrier[key] for name, key in wsgi if isinstance(carrier.get(key), str)
                }
                named = False
            elif value is not None or b"traceparent" in carrier:  # bytes (raw ASGI headers)
                named = True
            else:  # another case (`TRACEPARENT`), or none
                try:
                    named = "traceparent" in map(str.lower, carrier)  # C-speed, no copy
                except TypeError:  # names that are not all text
                    named = True
            if named:
                carrier = _text_carrier(carrier)
        return _propagator.extract(carrier=carrier)
    except Exception as exc:  # the SDK's own failure must never reach the host
        # the type only: a header's value may be a credential
        log_once(
            "request(headers=...): the trace context could not be read",
            detail=f" ({type(exc).__name__} from {type(headers).__name__} headers; "
            "the request starts a new trace)",
        )
        return otel_context.Context()  # as headers without a traceparent: a new trace


def consumer_left(exc: BaseException) -> bool:
    """Whether `exc` ending a request is its consumer going away, not a failure: a
    generator closed (`GeneratorExit`: `aclose()`, a `break`, garbage collection) or
    the task running it cancelled (a client disconnect under Starlette / uvicorn)."""
    if isinstance(exc, GeneratorExit):
        return True
    # no import here: a cancellation can only come from an event loop already imported
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None and isinstance(exc, asyncio.CancelledError):
        return True
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(exc, getattr(trio, "Cancelled", ()))


def add_identity(
    attrs: dict[str, Any],
    model: str | None,
    tenant: str | None,
    traffic_class: str | None,
    extra: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Adds who and what a call is for (docs/design.md §3) to `attrs`, then `extra`; gives `attrs`."""
    if model:
        attrs[semconv.REQUEST_MODEL] = model
    if tenant:
        attrs[semconv.TENANT] = tenant
    if traffic_class:
        attrs[semconv.TRAFFIC_CLASS] = traffic_class
    if extra:
        attrs.update(extra)
    return attrs


class RequestTrace(DeviceTally):
    """One request's span, phases and token times.

    Use `request()` to make one.  All times are taken from one monotonic clock
    and anchored to the wall clock once, at the start, so durations are exact
    and phases recorded on other threads line up.  It is the tally of forward
    passes run for it outside an engine step (`instrument_model`).
    """

    __slots__ = (
        "request_id",
        "_span",
        "_start_wall_ns",
        "_start_mono_ns",
        "_tokens",
        "_batches",
        "_phases",
        "_open",
        "_inside",
        "_finished",
        "_ctx_token",
        "_otel_ctx",
        "_attrs",
        "_raw",
        "_parent",
        "_tracing",
    )

    def __init__(
        self,
        name: str = semconv.SPAN_REQUEST,
        *,
        request_id: str | None = None,
        model: str | None = None,
        tenant: str | None = None,
        traffic_class: str | None = None,
        headers: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        # None (or "") is no id; any other value is one, 0 included (a scheduler's
        # first int id: its engine steps name it "0")
        if request_id.__class__ is str:
            if not request_id:
                request_id = _new_request_id()
        elif request_id is None:
            request_id = _new_request_id()
        else:  # an int or UUID from the host: its text
            request_id = _id_text(request_id)
        self.request_id = request_id
        self._start_mono_ns = time.monotonic_ns()
        self._start_wall_ns = time.time_ns()
        self._tokens: list[int] = []
        #: token-time lists of the `TokenBatch`es this request decoded in
        self._batches: list[list[int]] | None = None
        self._phases: list[tuple[str, int, int]] = []
        self._open: dict[str, int] = {}
        #: names of the `phase()` blocks open now, one entry per block (a wrapped
        #: tokenizer called inside `with req.phase("tokenize")` does not time itself)
        self._inside: list[str] = []
        self._finished = False
        self._ctx_token: _Activation | None = None
        #: (the OpenTelemetry context it was entered from, that context with its span current)
        self._otel_ctx: tuple[otel_context.Context, otel_context.Context] | None = None
        # forward passes run for this request (`instrument_model` adds to them);
        # zeroed here (DeviceTally has no __init__): no extra call on the hot path
        self.fwd_count = self.fwd_launched = self.fwd_host_ns = 0
        self.fwd_resolved = self.fwd_device_ns = 0
        tracing = runtime.get_tracing()
        self._tracing = tracing
        settings = tracing.settings
        cold = cold_start.tracker.observe(settings.cold_start_requests, settings.cold_start_idle_s)
        # The facts, kept raw: the attribute dict and the span are made when the
        # span is built (by the finisher, off the host's thread), or when asked for.
        self._raw = (name, model, tenant, traffic_class, attributes, cold)
        self._attrs: dict[str, Any] | None = None
        if headers is None:
            # no caller named: the span current here is the parent (a host's own SERVER
            # span from its framework's instrumentation, an in-process client's span);
            # not inside another request (a re-entrant handler): that one would read as
            # this one's caller, its time before this one as network, so a trace of its own
            self._parent: otel_context.Context | None
            if _current.get() is not None:
                self._parent = _NEW_TRACE
            else:
                parent = otel_context.get_current()
                valid = _get_current_span(parent).get_span_context().is_valid
                self._parent = parent if valid else None
        else:
            self._parent = _parent_from_headers(headers)
        self._span: trace.Span | None = None
        if tracing.pending_ids is None:  # the host's own provider or sampler: at once
            self._span = tracing.tracer.start_span(
                name,
                context=self._parent,
                kind=SpanKind.SERVER,
                attributes=self._attributes(),
                start_time=self._start_wall_ns,
            )

    def _attributes(self) -> dict[str, Any]:
        """Gives the request span's attribute dict (made once)."""
        attrs = self._attrs
        if attrs is None:
            with _lazy_lock:
                attrs = self._attrs
                if attrs is None:
                    _name, model, tenant, traffic_class, extra, cold = self._raw
                    attrs = {semconv.REQUEST_ID: self.request_id}
                    if cold:
                        attrs[semconv.COLD_START] = True
                    who = traffic_class or semconv.TRAFFIC_INTERACTIVE
                    self._attrs = attrs = add_identity(attrs, model, tenant, who, extra)
        return attrs

    # ---- hot path ---------------------------------------------------------
    def token(self, count: int = 1) -> None:
        """Records that `count` output tokens were produced now (an append)."""
        if count == 1:
            self._tokens.append(_monotonic_ns())
        else:
            try:
                self._tokens.extend([_monotonic_ns()] * count)
            except TypeError:  # a count as a string or a float: converted off the usual path
                self._tokens.extend([_monotonic_ns()] * count_or_zero(count, "token(count): count"))

    def start_phase(self, phase: str) -> None:
        """Marks the start of a phase (tokenize, queue, prefill, decode, detokenize)."""
        self._open[phase] = time.monotonic_ns()

    def end_phase(self, phase: str) -> None:
        """Marks the end of a phase started with `start_phase`."""
        # Under the lock `_finish_at` swaps the phase containers with: a scheduler thread
        # ending a phase while a handler finishes the request would otherwise take it
        # out of the open phases and append it to the list the finish has just dropped
        # (the phase lost), or append it beside the finish's copy of it (counted twice).
        with _phase_lock:
            start = self._open.pop(phase, None)
            if start is not None:
                self._phases.append((phase, start, time.monotonic_ns()))
                return
        if not self._finished:  # (after finish() a phase is no longer this request's)
            # one key for every phase: a host's names (maybe made per request) would
            # each log once more and stay in the set of logged sites for good
            log_once("end_phase() without start_phase()", detail=f" ({phase!r}: ignored)")

    @contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        """Times the body as one phase of this request."""
        inside = self._inside
        inside.append(phase)  # (append and remove: one C call each, safe across threads)
        start = time.monotonic_ns()
        try:
            yield
        finally:
            self._phases.append((phase, start, time.monotonic_ns()))
            inside.remove(phase)

    # ---- cold path ---------------------------------------------------------
    def set_attribute(self, key: str, value: Any) -> None:
        span = self.span
        if span.is_recording():
            span.set_attribute(key, value)
            self._attributes()[key] = value  # what the request says of itself wins over defaults

    def set_tokens(self, prompt: int | None = None, output: int | None = None) -> None:
        """Records token counts (output defaults to the number of token() calls)."""
        for key, value in ((semconv.PROMPT_TOKENS, prompt), (semconv.OUTPUT_TOKENS, output)):
            if value is not None:
                try:
                    count = int(value)
                except (TypeError, ValueError, OverflowError):
                    log_once(
                        f"set_tokens: {key} is not a number",
                        detail=f" ({describe(value)}; not recorded)",  # a prompt's text, maybe
                    )
                    continue
                self.set_attribute(key, count)

    def set_content(self, prompt: str | None = None, completion: str | None = None) -> None:
        """Records the prompt / completion text, only when configured with `record_content`.

        The SDK never records text on its own; without `record_content=True`
        (or `TOKENTRACE_RECORD_CONTENT=1`) this records nothing.
        """
        if not self._tracing.settings.record_content:
            return
        if prompt is not None:
            self.set_attribute(semconv.PROMPT_TEXT, str(prompt))
        if completion is not None:
            self.set_attribute(semconv.COMPLETION_TEXT, str(completion))

    def record_error(self, exc: BaseException) -> None:
        """Marks the request failed; the exception's message only with `record_content`
        (a message may quote the prompt: `_errors`)."""
        span = self.span
        if span.is_recording():
            record_error(span, exc, self._tracing.settings.record_content)

    @property
    def span(self) -> trace.Span:
        """The request span: live, or pending until the finisher builds it (see _pending_span)."""
        span = self._span
        if span is None:
            attrs = self._attributes()  # first: it takes the same lock
            with _lazy_lock:
                span = self._span
                if span is None:
                    name, start = self._raw[0], self._start_wall_ns
                    span = self._span = PendingSpan(name, attrs, self._parent, start, self.finish)
        return span

    @property
    def finished(self) -> bool:
        """Whether `finish()` ran (the request has ended)."""
        return self._finished

    @property
    def token_count(self) -> int:
        n = len(self._tokens)
        for times in self._batches or ():
            n += len(times)
        return n

    def traceparent(self) -> dict[str, str]:
        """Gives W3C trace-context headers that make a downstream call a child."""
        carrier: dict[str, str] = {}
        _propagator.inject(carrier, context=trace.set_span_in_context(self.span))
        return carrier

    def _wall(self, mono_ns: int) -> int:
        return self._start_wall_ns + (mono_ns - self._start_mono_ns)

    def finish(self, error: BaseException | None = None) -> None:
        """Ends the request; runs once.

        The host's thread only records the end time (and the error, while its
        traceback is alive); the request span's last attributes, its phase
        spans and its end are built by a daemon thread within
        `FINISH_INTERVAL_S` (`tracing.force_flush()` does it at once), so
        the span keeps its exact end time but leaves the process a little later.
        """
        self._finish_at(time.monotonic_ns(), error)

    def _finish_at(self, end_mono: int, error: BaseException | None) -> None:
        """`finish()`, with the end at `end_mono` (`time.monotonic_ns()`, passed): the ASGI
        middleware ends a request at its answer's last byte, and finishes it once an
        exception raised after that can no longer be the request's."""
        if self._finished:
            return
        self._finished = True
        with _phase_lock:  # (see end_phase)
            phases, opened = self._phases, self._open
            # phases marked from now on are not this request's any more
            self._phases = []
            self._open = {}
            # Phases never ended close now.  A `start_phase` on another thread may
            # still write into `opened`: the dict's copy is one C call, which no other
            # thread interleaves with (the GIL; a free-threaded build locks the dict),
            # where iterating it would fail with "dictionary changed size".
            unended = opened.copy()
        try:
            if error is not None:
                self.record_error(error)
            for phase, start in unended.items():
                phases.append((phase, start, end_mono))
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("request finish", exc)
        # tokens recorded after the finish are not this request's either: its own
        # list ends at its length now; its batches' lists are cut at `end_mono` by
        # the flusher (one per batch change: a loop whose batch changes every step
        # would otherwise cost this thread ~1 ms a 32k-token request here)
        n_tokens = len(self._tokens)
        batches = self._batches
        if not finisher.offer((self, end_mono, phases, n_tokens, batches)):
            # a full queue: built here, rather than lost
            self._complete(end_mono, phases, n_tokens, batches)

    def _complete(
        self,
        end_mono: int,
        phases: list[tuple[str, int, int]],
        n_tokens: int,
        batches: list[list[int]] | None = None,
    ) -> None:
        """Builds the phase spans and the last attributes, and ends the span (the flusher's work)."""
        span = self._span
        if span is None or isinstance(span, PendingSpan):
            tracing = self._tracing
            if tracing.closed:
                # configure() or shutdown() came while it ran: built by what is in force now
                # (after shutdown(), a configuration that exports nothing and says so)
                tracing = self._tracing = runtime.get_tracing()
            if tracing.settings.disabled:
                # nothing is exported: building the spans would cost the host ~100 µs of
                # CPU a request for nothing (TOKENTRACE_DISABLED is how hosts turn us off)
                if span is not None:
                    span.release()
                return
            pending = self.span
            if isinstance(pending, PendingSpan):
                if not pending.sampled:
                    # an unsampled caller's trace, and a sampler the host named that follows it
                    # (`follows_unsampled_callers`): nothing is recorded
                    pending.release()
                    return
                try:
                    span = self._span = pending.build(tracing.tracer, tracing.pending_ids)
                except Exception as exc:  # the SDK's own failure must never reach the host
                    log_once("request span build", exc)
                    return
            else:
                span = pending
        try:
            if span.is_recording():
                self._emit_children(span, phases, end_mono)
                tokens = self._tokens[:n_tokens]
                # a copy each: a batch made after the finish may still add itself, and
                # one alive at the finish may still append
                for times in batches[:] if batches else ():
                    times = times[:]
                    if times and times[-1] > end_mono:  # recording at the finish: up to it
                        times = [t for t in times if t <= end_mono]
                    tokens += times
                # `token()` calls and batches interleave in time, and two threads recording
                # one request's tokens (`record_tokens` on the engine's, `token()` on the
                # handler's) append out of clock order; sorted times are one pass (~6 µs a
                # thousand tokens, on this thread)
                tokens.sort()
                n_tokens = len(tokens)
                if n_tokens:
                    base = self._start_mono_ns
                    span.set_attribute(
                        semconv.TOKEN_OFFSETS_US,
                        semconv.pack_list([(t - base) // 1000 for t in tokens]),
                    )
                    if semconv.OUTPUT_TOKENS not in self._attributes():
                        span.set_attribute(semconv.OUTPUT_TOKENS, n_tokens)
                if self.fwd_count:
                    self._emit_forward(span, self)
                gpu = gpu_summary(self._start_wall_ns, self._wall(end_mono))
                if gpu:
                    span.set_attributes(gpu)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("request span finish", exc)
        finally:
            span.end(end_time=self._wall(end_mono))

    @staticmethod
    def _emit_forward(span: trace.Span, tally: DeviceTally) -> None:
        if not tally.fwd_complete:
            poll_device_timings()  # non-blocking: resolves CUDA events that are done
        span.set_attribute(semconv.FORWARD_COUNT, tally.fwd_count)
        span.set_attribute(semconv.FORWARD_HOST_US, tally.fwd_host_ns // 1000)
        if tally.fwd_complete and tally.fwd_launched:
            span.set_attribute(semconv.FORWARD_GPU_US, tally.fwd_device_ns // 1000)

    def _emit_children(
        self, span: trace.Span, phases: list[tuple[str, int, int]], end_mono: int
    ) -> None:
        """Builds a child span per phase; a phase run more than `PHASE_SPANS_MAX` times
        (a streaming server's detokenize, `tok.decode` per token) is summarized on `span`:
        its calls and their summed time (`semconv.PHASE_CALLS_SUFFIX`), no spans.

        Phases end with the request at the latest (`end_mono`): another thread marking a
        phase while the request finishes reads its clock after the finish did.  A phase
        that starts after the request ended is not its own."""
        tracer = self._tracing.tracer
        ctx = trace.set_span_in_context(span)
        summed: dict[str, list[int]] | None = None  # phase -> [calls, total ns]
        if len(phases) > PHASE_SPANS_MAX:  # (the usual request has fewer: no counting)
            counts = Counter(map(_phase_name, phases))
            summed = {
                phase: [0, 0]
                for phase, n in counts.items()
                if n > PHASE_SPANS_MAX and phase not in PHASES_ALWAYS_SPANS
            }
        for phase, start, end in phases:
            if end > end_mono:
                end = end_mono
            if start > end:
                continue
            if summed and phase in summed:
                tally = summed[phase]
                tally[0] += 1
                tally[1] += end - start
                continue
            name = semconv.PHASES.get(phase, f"tokentrace.{phase}")
            child = tracer.start_span(name, context=ctx, start_time=self._wall(start))
            child.end(end_time=self._wall(end))
        if summed:
            for phase, (calls, total_ns) in summed.items():
                name = semconv.PHASES.get(phase, f"tokentrace.{phase}")
                span.set_attribute(name + semconv.PHASE_CALLS_SUFFIX, calls)
                span.set_attribute(name + semconv.PHASE_TOTAL_US_SUFFIX, total_ns // 1000)

    # ---- context manager ---------------------------------------------------
    def __enter__(self) -> RequestTrace:
        self._ctx_token = self._activate()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        tokens = self._ctx_token
        if tokens is not None:
            self._ctx_token = None
            self._deactivate(tokens)
        self._end(exc)

    async def __aenter__(self) -> RequestTrace:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    def _activate(self) -> _Activation:
        """Makes this request current in this context (`current_request()`) and its span
        OpenTelemetry's current span; gives what `_deactivate` undoes.

        Spans started inside the request by other code (an instrumented httpx
        call, the host's own OpenTelemetry spans) are then its children, in its
        trace: a gateway's call to its backend continues the user's trace.  A
        pending span is current as itself (its ids exist from the start).
        """
        token = _current.set(self)
        if self._tracing.settings.disabled:
            return token, None  # nothing is exported: the host's own spans stay as they were
        try:
            # made once per context it enters from: a streamed body enters anew for
            # each item it yields (the context's copy is a dict copy, ~0.4 µs)
            base = otel_context.get_current()
            made = self._otel_ctx
            if made is None or made[0] is not base:
                made = self._otel_ctx = (base, trace.set_span_in_context(self.span, base))
            otel_token = otel_context.attach(made[1])
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("request context attach", exc)
            otel_token = None
        return token, otel_token

    def _deactivate(self, tokens: _Activation) -> None:
        """Undoes `_activate`, also when left in another context (see `_leave_other_context`)."""
        token, otel_token = tokens
        try:
            _current.reset(token)
        except ValueError:  # left in another context (see _leave_other_context)
            self._leave_other_context(token)
        if otel_token is not None:
            _detach_otel(otel_token, self._span)

    def _end(self, error: BaseException | None) -> None:
        """Finishes the request as its block or streamed body ends with `error` (None: fine).

        Its consumer going away (`consumer_left`: a stream closed, the task
        reading it cancelled by a client disconnect) is no server error: the
        request is marked `semconv.REQUEST_DISCONNECTED`, its status left
        unset, as the ASGI middleware marks a client gone.  `with tt.request()`
        and the decorators both end their requests here, so that they agree.
        """
        if error is not None and consumer_left(error):
            try:
                self.set_attribute(semconv.REQUEST_DISCONNECTED, True)
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once("request disconnect attribute", exc)
            error = None
        self.finish(error)

    def _leave_other_context(self, token: contextvars.Token[RequestTrace | None]) -> None:
        # An async generator holding `with tt.request()` that the consumer
        # abandoned is closed by asyncio's finalizer in a task of its own: its
        # context is a copy, where the token does not apply.  The request still
        # ends, and the host's own exception (GeneratorExit) is what goes on.
        if _current.get() is self:
            old = token.old_value
            _current.set(None if old is contextvars.Token.MISSING else old)


def _detach_otel(token: object, span: trace.Span | None) -> None:
    """Makes OpenTelemetry's current context again what it was before `attach` gave `token`."""
    if isinstance(token, contextvars.Token):  # OpenTelemetry's default runtime context
        try:
            token.var.reset(token)
        except ValueError:
            # Left in another context (an abandoned async stream closed by asyncio's
            # finalizer): OpenTelemetry's `detach` would log it at ERROR with a
            # traceback.  There, the request's span stops being current.
            try:
                if trace.get_current_span() is span:
                    old = token.old_value
                    token.var.set(
                        otel_context.Context() if old is contextvars.Token.MISSING else old
                    )
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once("request context detach", exc)
        except RuntimeError:  # used already
            pass
        return
    try:
        otel_context.detach(token)  # type: ignore[arg-type]  # another runtime context: its rules
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("request context detach", exc)


_Finishing = tuple[
    RequestTrace, int, list[tuple[str, int, int]], int, list[list[int]] | None
]


class RequestFinisher(QueueFlusher[_Finishing]):
    """Finished requests waiting for their spans to be built, and the thread that builds them."""

    def __init__(
        self, interval_s: float = FINISH_INTERVAL_S, max_pending: int = MAX_PENDING_FINISHES
    ) -> None:
        super().__init__("tokentrace-finisher", interval_s, max_pending, wake_at=FINISH_WAKE_AT)

    def flush(self, final: bool = True) -> int:
        with self._flush_lock:
            items = self._items
            done = 0
            # what waits now, not what requests finished meanwhile add: under a steady
            # load "until empty" never ended, and a force_flush() or shutdown() waited on it
            for _ in range(len(items)):
                req, end_mono, phases, n_tokens, batches = items.popleft()
                req._complete(end_mono, phases, n_tokens, batches)
                done += 1
                if not final:
                    self._yield_gil()
            return done


finisher = RequestFinisher()
runtime.add_flush_hook(lambda: finisher.flush())  # late-bound: tests swap the finisher


#: `tt.request(name=..., *, request_id=, model=, tenant=, traffic_class=, headers=,
#: attributes=)` gives a new request trace; use it as a context manager or call
#: `finish()`.  `headers` are the incoming HTTP headers (a mapping or (name, value)
#: pairs; names in any case, text or bytes): a W3C `traceparent` in them makes the
#: request span the child of the caller's client span; headers it cannot read are
#: logged once and the request starts a new trace.  The class itself, not a
#: factory function: one Python call less per request.
request = RequestTrace


def record_tokens(requests: Iterable[RequestTrace]) -> None:
    """Records one output token produced now for each of `requests`: one call a batch step.

    The same as `req.token()` on each, with one clock read for the batch (the
    step produced their tokens together) and one Python call instead of one
    per request, which is what a serving loop's step can afford.
    """
    now = _monotonic_ns()
    try:  # free when nothing is raised (Python 3.11+)
        for req in requests:
            req._tokens.append(now)
    except AttributeError as exc:
        log_once(
            "record_tokens takes requests (tt.request())",
            detail=f" ({exc}; that step's tokens from it on are not recorded)",
        )


class TokenBatch:
    """Requests that decode together until the batch changes: one token time a step for all.

    A continuous-batching loop makes one when its batch changes (requests
    join or leave) and then records each step's tokens with one append —
    `engine_step(..., tokens=batch)` at the step's end, or `batch.token()` —
    instead of one per request (`record_tokens`).  Each member's token times
    are read from the batch when its spans are built; tokens timed after a
    member's `finish()` are not its own.  Membership is fixed: make a new
    batch for a new set of requests.
    """

    __slots__ = ("request_ids", "_times")

    def __init__(self, requests: Iterable[RequestTrace]) -> None:
        # The batch keeps its members' ids and they keep its token-time list:
        # neither holds the other, so no cycle outlives them.
        ids = []
        times: list[int] = []
        self._times = times
        for req in requests:
            try:
                rid = req.request_id
                if req._batches is None:
                    req._batches = [times]
                else:
                    req._batches.append(times)
            except AttributeError:
                log_once(
                    "TokenBatch takes requests (tt.request())",
                    detail=f", not {describe(req)} (left out of the batch)",
                )
                continue
            ids.append(rid)
        self.request_ids = tuple(ids)

    def token(self) -> None:
        """Records one output token produced now for every member (an append)."""
        self._times.append(_monotonic_ns())


def current_request() -> RequestTrace | None:
    """Gives the request being handled in this context, if any."""
    return _current.get()
