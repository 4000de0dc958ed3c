"""The client side: a CLIENT span around one call, with streamed-chunk times.

The client span's duration minus the server's request span duration is the
network time; its first chunk time is the TTFT the user felt (DESIGN.md §2).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokentrace.instrumentation import semconv
from tokentrace.instrumentation._config import get_tracing
from tokentrace.instrumentation._errors import record_error
from tokentrace.instrumentation._request import add_identity
from tokentrace.instrumentation._safety import count_or_zero, log_once

_propagator = TraceContextTextMapPropagator()


class ClientRequest:
    """One client call: `with` / `async with`; `.chunk()` on each streamed chunk."""

    __slots__ = ("_span", "_start_mono_ns", "_start_wall_ns", "_chunks", "_finished", "_ctx")

    def __init__(
        self,
        *,
        model: str | None = None,
        tenant: str | None = None,
        traffic_class: str | None = None,
        name: str = semconv.SPAN_CLIENT,
        attributes: Mapping[str, Any] | None = None,
        context: otel_context.Context | None = None,
    ) -> None:
        attrs = add_identity({}, model, tenant, traffic_class, attributes)
        self._chunks: list[int] = []
        self._finished = False
        self._ctx: Any = None
        self._start_mono_ns = time.monotonic_ns()
        self._start_wall_ns = time.time_ns()
        self._span = get_tracing().tracer.start_span(
            name,
            context=context,  # None: the current span is the parent
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=self._start_wall_ns,
        )

    @property
    def span(self) -> trace.Span:
        return self._span

    # ---- hot path ---------------------------------------------------------
    def chunk(self, n: int = 1) -> None:
        """Records that `n` streamed chunks arrived now (an append)."""
        now = time.monotonic_ns()
        if n == 1:
            self._chunks.append(now)
        else:
            try:
                self._chunks.extend([now] * n)
            except TypeError:  # a count as a string or a float: converted off the usual path
                self._chunks.extend([now] * count_or_zero(n, "chunk(n): n"))

    # ---- cold path ---------------------------------------------------------
    def headers(self, existing: Mapping[str, str] | None = None) -> dict[str, str]:
        """Gives `existing` headers plus `traceparent` (the server span becomes our child)."""
        carrier = dict(existing or {})
        _propagator.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    def set_tokens(self, prompt: int | None = None, output: int | None = None) -> None:
        """Records token counts; a value that is no number is logged once, not recorded."""
        if not self._span.is_recording():
            return
        for key, value in ((semconv.PROMPT_TOKENS, prompt), (semconv.OUTPUT_TOKENS, output)):
            if value is None:
                continue
            try:
                count = int(value)
            except (TypeError, ValueError, OverflowError):
                # only its type: the value may be the prompt itself (`prompt=text`, a slip)
                log_once(
                    f"client set_tokens: {key} is not a number",
                    detail=f" (a {type(value).__name__}; not recorded)",
                )
                continue
            self._span.set_attribute(key, count)

    def set_attribute(self, key: str, value: Any) -> None:
        if self._span.is_recording():
            self._span.set_attribute(key, value)

    def record_error(self, exc: BaseException) -> None:
        """Marks the call failed; the exception's message only with `record_content`."""
        if self._span.is_recording():
            record_error(self._span, exc, get_tracing().settings.record_content)

    @property
    def chunk_count(self) -> int:
        return len(self._chunks)

    def finish(self, error: BaseException | None = None) -> None:
        """Records chunk times and TTFC and ends the client span; runs once."""
        if self._finished:
            return
        self._finished = True
        end_mono = time.monotonic_ns()
        span = self._span
        try:
            if error is not None:
                self.record_error(error)
            if span.is_recording() and self._chunks:
                base = self._start_mono_ns
                offsets = [(t - base) // 1000 for t in self._chunks]
                span.set_attribute(semconv.CLIENT_CHUNK_OFFSETS_US, semconv.pack_list(offsets))
                span.set_attribute(semconv.CLIENT_CHUNKS, len(offsets))
                span.set_attribute(semconv.CLIENT_TTFC_S, (self._chunks[0] - base) / 1e9)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("client span finish", exc)
        finally:
            span.end(end_time=self._start_wall_ns + (end_mono - self._start_mono_ns))

    def abandon(self) -> None:
        """Ends the span of a call its caller dropped before its end (a streamed response
        garbage-collected unread), marked `tokentrace.request.disconnected`; once finished,
        nothing.  No error: the caller chose to stop."""
        if self._finished:
            return
        try:
            self.set_attribute(semconv.REQUEST_DISCONNECTED, True)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("client span abandon", exc)
        self.finish()

    # ---- context managers (sync and async) ---------------------------------
    def __enter__(self) -> ClientRequest:
        self._ctx = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._detach()
        self.finish(exc)

    async def __aenter__(self) -> ClientRequest:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    def _detach(self) -> None:
        token = self._ctx
        if token is None:
            return
        self._ctx = None
        if isinstance(token, contextvars.Token):  # OpenTelemetry's default runtime context
            try:
                token.var.reset(token)
                return
            except ValueError:
                # Left in another context: an async generator holding `async with
                # client_request()` that its consumer abandoned is closed by asyncio's
                # finalizer in a task of its own, where the token does not apply
                # (OpenTelemetry's `detach` would log it at ERROR with a traceback).
                # The span still ends; there, our span stops being current.
                self._leave_other_context(token)
                return
            except RuntimeError:  # used already
                return
        try:
            otel_context.detach(token)  # another runtime context: its own rules
        except Exception as exc:
            log_once("client context detach", exc)

    def _leave_other_context(self, token: contextvars.Token[Any]) -> None:
        try:
            if trace.get_current_span() is self._span:
                old = token.old_value
                token.var.set(otel_context.Context() if old is contextvars.Token.MISSING else old)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("client context detach", exc)


def client_request(
    *,
    model: str | None = None,
    tenant: str | None = None,
    traffic_class: str | None = None,
    name: str = semconv.SPAN_CLIENT,
    attributes: Mapping[str, Any] | None = None,
) -> ClientRequest:
    """Gives a client-call tracer: use `with` / `async with`, send `.headers()`, call `.chunk()`."""
    return ClientRequest(
        model=model, tenant=tenant, traffic_class=traffic_class, name=name, attributes=attributes
    )
