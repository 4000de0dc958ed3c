"""The client side: a CLIENT span around one call, with streamed-chunk times.

The client span's duration minus the server's request span duration is the
network time; its first chunk time is the TTFT the user felt (docs/design.md §2).
So a chunk is a piece of the answer: of a server-sent-events stream
(`text/event-stream`), an event that carries a token (`sse_data_is_token`), not
the role-only first delta, a keep-alive comment or a `message_start` that
servers send before the first token, at once.
"""

from __future__ import annotations

import contextvars
import json
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokentrace.instrumentation import semconv
from tokentrace.instrumentation._errors import record_error
from tokentrace.instrumentation._request import add_identity
from tokentrace.instrumentation._runtime import runtime
from tokentrace.instrumentation._safety import count_or_zero, log_once

_propagator = TraceContextTextMapPropagator()

#: Anthropic's stream events that carry no output: of its event types only
#: `content_block_delta` carries tokens (text, thinking, a tool call's input).
ANTHROPIC_NO_TOKEN_TYPES = frozenset(
    {
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_stop",
        "ping",
        "error",
    }
)
_BOM = b"\xef\xbb\xbf"


def sse_data_is_token(data: bytes) -> bool:
    """Whether one server-sent event's data (its `data:` lines joined) carries a token.

    Not a token: `[DONE]`; an empty data; an OpenAI chat / completions chunk whose
    choices all have nothing but `role` in their delta (or an empty completions
    `text`): the role-only first delta, a finish-only or usage-only (`choices: []`)
    last one; an Anthropic event other than `content_block_delta` (`message_start`,
    `ping`, `content_block_start`, ...); an OpenAI Responses API event that is not a
    `*.delta` (`response.created`, `response.completed`, ...); an error object
    (`{"error": {...}}`).  Any
    other data (JSON of a shape not known here, or no JSON) is a token: a server we do
    not know loses no chunk.

    Cheap where it matters: a token chunk is told by a substring (in JSON a `"` inside
    a string is escaped, so `"content":"` is a key and the start of its text); only a
    chunk that may be one of the known empty shapes is parsed.
    """
    if data[:1] != b"{":
        data = data.strip()
        if data[:1] != b"{":
            return bool(data) and data != b"[DONE]"
    at = data.find(b'"content":')
    if at >= 0:  # OpenAI's delta content (compact, or with Python's ": ")
        at += 10
        if data[at : at + 1] == b" ":
            at += 1
        if data[at : at + 1] == b'"' and data[at + 1 : at + 2] != b'"':
            return True  # text that is not ""
    if b'"content_block_delta"' in data:
        return True  # Anthropic's token event
    if b'"choices"' in data:
        for key in _OTHER_TEXT_KEYS:
            if _has_text(data, key):
                return True
    elif b'"type"' not in data and b'"error"' not in data:
        return True  # none of the shapes known here: a token
    try:
        event = json.loads(data)
    except ValueError:
        return True
    return _event_is_token(event)


#: an OpenAI chunk's other text: a completions `text`, a reasoning model's delta
_OTHER_TEXT_KEYS = (b'"text":', b'"reasoning_content":', b'"reasoning":')


def _has_text(data: bytes, key: bytes) -> bool:
    """Whether `key` (`b'"name":'`) is followed by a string that is not empty."""
    at = data.find(key)
    if at < 0:
        return False
    at += len(key)
    if data[at : at + 1] == b" ":
        at += 1
    return data[at : at + 1] == b'"' and data[at + 1 : at + 2] != b'"'


def _event_is_token(event: Any) -> bool:
    if event.__class__ is not dict:
        return True
    choices = event.get("choices")
    if choices.__class__ is list:  # OpenAI chat / completions chunk
        return any(_choice_has_output(choice) for choice in choices)
    kind = event.get("type")
    if kind.__class__ is str:
        if kind.startswith("response."):  # OpenAI's Responses API: output comes in `*.delta`
            return kind.endswith(".delta")  # (`response.created`, `.in_progress`: no token)
        return kind not in ANTHROPIC_NO_TOKEN_TYPES  # Anthropic's events name their type
    return not ("error" in event and len(event) == 1)  # `{"error": {...}}` mid-stream


def _choice_has_output(choice: Any) -> bool:
    """Whether an OpenAI chunk's choice carries output: anything but `role` in its delta
    that is not empty (content, tool_calls, reasoning content, refusal, ...), or a
    completions chunk's `text`."""
    if choice.__class__ is not dict:
        return True
    delta = choice.get("delta")
    if delta.__class__ is dict:
        return any(value for key, value in delta.items() if key != "role")
    if "text" in choice:
        return bool(choice["text"])
    return True


class SseEvents:
    """Splits a `text/event-stream` body into events (the WHATWG rules: lines end at
    LF, CRLF or CR; a blank line ends an event; `:` starts a comment; only `data`
    fields are kept) and tells which carry a token (`sse_data_is_token`).  An event is
    complete at its blank line; one the stream ends before is not dispatched (as
    `EventSource` and the openai client do)."""

    __slots__ = ("_tail", "_data", "_mend")

    def __init__(self) -> None:
        self._tail: list[bytes] = []  # a line not ended yet, by read
        self._data: bytes | None = None  # the event's data so far
        #: the start of the next read needs a look: the body's first (a byte-order mark),
        #: or one after a read that ended with CR (a CRLF split over two reads: its LF
        #: ends no second line).  A leading LF dropped from the first read was a blank
        #: line before any event: nothing either way.
        self._mend = True

    def feed(self, chunk: bytes) -> int:
        """Takes one read of the body; gives how many token events it completed."""
        if self._mend and chunk:
            self._mend = False
            if chunk[:3] == _BOM:
                chunk = chunk[3:]
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._mend = chunk[-1:] == b"\r"
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        tail = self._tail
        if (
            not tail
            and chunk[:6] == b"data: "
            and chunk.find(b"\n") == len(chunk) - 2
            and chunk[-1] == 10  # "\n"
            and self._data is None
        ):  # the usual read: one whole event of one data line
            return 1 if sse_data_is_token(chunk[6:-2]) else 0
        if tail:
            tail.append(chunk)
            if b"\n" not in chunk:
                return 0
            chunk = b"".join(tail)
            tail.clear()
        lines = chunk.split(b"\n")
        rest = lines.pop()  # the start of a line not ended yet
        if rest:
            tail.append(rest)
        tokens = 0
        for line in lines:  # (as `line()`, inline: this runs for every read)
            if not line:
                data = self._data
                if data is not None:
                    self._data = None
                    if sse_data_is_token(data):
                        tokens += 1
            elif line[:5] == b"data:":
                value = line[6:] if line[5:6] == b" " else line[5:]
                data = self._data
                self._data = value if data is None else data + b"\n" + value
            elif line == b"data":
                data = self._data
                self._data = b"" if data is None else data + b"\n"
        return tokens

    def line(self, line: bytes) -> bool:
        """Takes one line (without its end); gives whether it completed a token event."""
        if not line:  # a blank line ends the event
            data = self._data
            if data is None:
                return False
            self._data = None
            return sse_data_is_token(data)
        if line[:5] == b"data:":
            value = line[5:]
            if value[:1] == b" ":
                value = value[1:]
        elif line == b"data":
            value = b""
        else:
            return False  # a comment (`: ping`), `event:`, `id:`, `retry:`
        data = self._data
        self._data = value if data is None else data + b"\n" + value
        return False


class ClientRequest:
    """One client call: `with` / `async with`; `.chunk()` on each streamed chunk, or
    `.sse_line()` on each line of a `text/event-stream` body."""

    __slots__ = (
        "_span",
        "_start_mono_ns",
        "_start_wall_ns",
        "_chunks",
        "_finished",
        "_ctx",
        "_sse",
    )

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
        #: the event parser of a `text/event-stream` body (`sse_line`, `_read`)
        self._sse: SseEvents | None = None
        self._start_mono_ns = time.monotonic_ns()
        self._start_wall_ns = time.time_ns()
        self._span = runtime.get_tracing().tracer.start_span(
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

    def sse_line(self, line: str | bytes) -> None:
        """Takes one line of a `text/event-stream` body as `aiter_lines()` / `iter_lines()`
        give it (every line, blank ones included: a blank line ends an event); records a
        chunk now when the line completes an event that carries a token (text or bytes; a
        piece holding several lines is read as those lines).  Comments (`:
        ping`), `[DONE]`, an OpenAI role-only / finish-only / usage-only chunk and
        Anthropic's events other than `content_block_delta` are no chunk (as the httpx
        integration counts them: `sse_data_is_token`)."""
        now = time.monotonic_ns()
        try:
            sse = self._sse
            if sse is None:
                sse = self._sse = SseEvents()
            raw = line.encode() if isinstance(line, str) else line
            one = raw.rstrip(b"\r\n")
            if b"\n" in one or b"\r" in one:  # more than one line: read as a piece of the body
                ended = raw[-1:] in (b"\n", b"\r")
                self._chunks.extend([now] * sse.feed(raw if ended else raw + b"\n"))
            elif sse.line(one):
                self._chunks.append(now)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("client sse_line", exc)

    def _read(self, data: bytes) -> None:
        """Records one read of a streamed body that arrived now (the httpx integration):
        a chunk per read, or, once `_parse_sse()` was called, a chunk (at this read's
        time) per token event the read completed."""
        now = time.monotonic_ns()
        sse = self._sse
        if sse is None:
            self._chunks.append(now)
            return
        try:
            n = sse.feed(data)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("client event-stream parse", exc)
            self._sse = None  # per read from here on
            self._chunks.append(now)
            return
        if n == 1:
            self._chunks.append(now)
        elif n:
            self._chunks.extend([now] * n)

    def _parse_sse(self) -> None:
        """Makes `_read()` count token events of a `text/event-stream` body, not reads."""
        self._sse = SseEvents()

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
            record_error(self._span, exc, runtime.get_tracing().settings.record_content)

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
