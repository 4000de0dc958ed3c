"""httpx integration: a client span + `traceparent` per request, chunk times when streamed.

A chunk is what the user waits for.  Of a `text/event-stream` response it is an
event that carries a token (`_client.sse_data_is_token`), timed at the read that
completed it (several in one read share that read's time): the role-only first
delta, keep-alive comments and Anthropic's `message_start` / `ping` arrive before
the first token and would set TTFT (user).  Any other streamed body (and an event
stream sent compressed, whose bytes cannot be read here) gets a chunk per read.

httpx is imported only when `instrument_httpx()` is called.  `httpx2` (the
next major httpx, under its own import name; what `openai` 3 builds its clients
on) has the same API and is traced the same way: a client of either is
instrumented, and `instrument_httpx()` covers the classes of both where installed.
"""

from __future__ import annotations

import contextvars
import importlib
import importlib.util
import inspect
import json
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import wrapt
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokentrace.instrumentation import semconv
from tokentrace.instrumentation._client import ClientRequest
from tokentrace.instrumentation._errors import HttpStatusError
from tokentrace.instrumentation._request import consumer_left
from tokentrace.instrumentation._safety import log_once

_in_client_span: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tokentrace_httpx", default=False
)
_classes_instrumented = False
#: the packages with httpx's API: httpx, and httpx2 under its own name
HTTPX_MODULES = ("httpx", "httpx2")
#: chunk-recording stream classes per (package, "sync" | "async")
_stream_types: dict[tuple[str, str], type] = {}
#: Request bodies up to this size are read for a JSON `model` field (OpenAI-style APIs).
MODEL_SNIFF_MAX_BYTES = 256 * 1024
_propagator = TraceContextTextMapPropagator()


def _streams(package: str) -> tuple[type, type]:
    """Gives the chunk-recording stream classes of `package` (httpx or httpx2; built on
    first use: they subclass its byte streams)."""
    if (package, "sync") not in _stream_types:
        httpx: Any = importlib.import_module(package)

        class SyncChunkStream(httpx.SyncByteStream):
            def __init__(self, inner: Any, client: ClientRequest) -> None:
                self._inner = inner
                self._client = client
                self._reading = False
                _end_when_dropped(self, client)

            def __iter__(self) -> Iterator[bytes]:
                self._reading = True
                try:
                    read = self._client._read
                    for chunk in self._inner:
                        read(chunk)
                        yield chunk
                except BaseException as exc:
                    _end_early(self._client, exc)
                    raise
                self._client.finish()

            def close(self) -> None:
                try:
                    self._inner.close()
                finally:
                    _end_closed(self._client, self._reading)

        class AsyncChunkStream(httpx.AsyncByteStream):
            def __init__(self, inner: Any, client: ClientRequest) -> None:
                self._inner = inner
                self._client = client
                self._reading = False
                _end_when_dropped(self, client)

            async def __aiter__(self) -> AsyncIterator[bytes]:
                self._reading = True
                try:
                    read = self._client._read
                    async for chunk in self._inner:
                        read(chunk)
                        yield chunk
                except BaseException as exc:
                    _end_early(self._client, exc)
                    raise
                self._client.finish()

            async def aclose(self) -> None:
                try:
                    await self._inner.aclose()
                finally:
                    _end_closed(self._client, self._reading)

        _stream_types[package, "sync"] = SyncChunkStream
        _stream_types[package, "async"] = AsyncChunkStream
    return _stream_types[package, "sync"], _stream_types[package, "async"]


def _end_early(client: ClientRequest, exc: BaseException) -> None:
    """Ends `client`'s span as its streamed body stops at `exc`.  Its reader going away
    (`consumer_left`: a `break` out of `iter_lines()`, the generator closed, the task
    reading it cancelled) is no failure: the span is ended as a stream dropped unread is
    (`ClientRequest.abandon`: marked disconnected, status unset); anything else (a read
    timeout, the connection lost) is the call's error."""
    if consumer_left(exc):
        client.abandon()
    else:
        client.finish(exc)


def _end_closed(client: ClientRequest, reading: bool) -> None:
    """Ends `client`'s span as its response is closed (`with client.stream()` left, say);
    once its body was read to the end, nothing.  Closed while being read, before its end
    (a `break` out of `aiter_lines()`: `async with` closes the response before asyncio
    closes the generator), the reader stopped: as `_end_early`, no error."""
    if reading:
        client.abandon()
    else:
        client.finish()


def _end_when_dropped(stream: object, client: ClientRequest) -> None:
    """Ends `client`'s span when `stream` is garbage-collected unfinished: a streamed
    response dropped without being read to its end or closed (`send(stream=True)`,
    an openai stream never iterated) would otherwise leave it open for good."""
    try:
        weakref.finalize(stream, client.abandon).atexit = False
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("httpx stream finalizer", exc)


def _start_span(request: Any) -> ClientRequest | None:
    """Opens the client span and injects `traceparent`; None when the call is traced already:
    inside one of our client spans, or carrying the current span's `traceparent` (another
    instrumentation's client span, injected for this very request).  A `traceparent` of
    any other span (the incoming request's, copied by a proxy forwarding its headers) is
    replaced by our span's; where no span is current (a gateway whose server side is not
    traced), our span continues the trace that `traceparent` names."""
    if _in_client_span.get():
        return None
    try:
        if _traced_elsewhere(request.headers):
            return None
        attrs: dict[str, Any] = {
            semconv.HTTP_METHOD: request.method,
            semconv.SERVER_ADDRESS: request.url.host,
            semconv.URL_PATH: request.url.path,
        }
        model = _sniff_model(request)
        cr = ClientRequest(
            model=model, attributes=attrs, context=_forwarded_parent(request.headers)
        )
        if "traceparent" in request.headers:
            # the `tracestate` sent with the `traceparent` we replace goes with it: ours
            # (below) carries any that our span's parent came with
            request.headers.pop("tracestate", None)
        for k, v in cr.headers().items():
            request.headers[k] = v
        return cr
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("httpx client span", exc)
        return None


def _forwarded_parent(headers: Any) -> Any:
    """The trace a forwarded `traceparent` names, for our span to continue where no span is
    current (a gateway that traces its calls, not its own requests); else None (the
    current span, if any, is the parent)."""
    sent = headers.get("traceparent")
    if sent is None or trace.get_current_span().get_span_context().is_valid:
        return None
    carrier = {"traceparent": sent}
    state = headers.get("tracestate")
    if state is not None:
        carrier["tracestate"] = state
    parent = _propagator.extract(carrier)
    return parent if trace.get_current_span(parent).get_span_context().is_valid else None


def _traced_elsewhere(headers: Any) -> bool:
    """Whether `headers` carry a `traceparent` naming the current span: another
    instrumentation's client span (started as current, injected for this request)."""
    sent = headers.get("traceparent")
    if sent is None:
        return False
    current = trace.get_current_span().get_span_context()
    if not current.is_valid:
        return False
    named = trace.get_current_span(_propagator.extract({"traceparent": sent})).get_span_context()
    return named.trace_id == current.trace_id and named.span_id == current.span_id


def _sniff_model(request: Any) -> str | None:
    if "json" not in request.headers.get("content-type", ""):
        return None
    try:
        content = request.content  # raises for a streaming body not yet read
    except Exception:
        return None
    if not content or len(content) > MODEL_SNIFF_MAX_BYTES:
        return None
    try:
        body = json.loads(content)
    except ValueError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def _after_response(cr: ClientRequest, response: Any, streaming: bool, async_: bool) -> None:
    try:
        cr.set_attribute(semconv.HTTP_STATUS, response.status_code)
        if response.status_code >= 400:
            # on a CLIENT span 4xx is an error too (OpenTelemetry's HTTP conventions):
            # a 429 or a 404 is a call the user did not get an answer from
            cr.record_error(HttpStatusError(f"HTTP {response.status_code}"))
        if streaming:
            sync_cls, async_cls = _streams(_package_of(response))
            if _is_event_stream(response.headers):
                cr._parse_sse()
            response.stream = (async_cls if async_ else sync_cls)(response.stream, cr)
            return
    except Exception as exc:
        log_once("httpx response", exc)
    cr.finish()


def _is_event_stream(headers: Any) -> bool:
    """Whether a response is a server-sent-events stream read as sent (`text/event-stream`,
    no `content-encoding`: compressed bytes are decoded past our stream, not in it)."""
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    encoding = headers.get("content-encoding", "").strip().lower()
    return media == "text/event-stream" and encoding in ("", "identity")


def _sync_send(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    request = args[0] if args else kwargs.get("request")
    cr = _start_span(request) if request is not None else None
    if cr is None:
        return wrapped(*args, **kwargs)
    token = _in_client_span.set(True)
    try:
        response = wrapped(*args, **kwargs)
    except BaseException as exc:
        cr.finish(exc)
        raise
    finally:
        _in_client_span.reset(token)
    _after_response(cr, response, bool(kwargs.get("stream", False)), async_=False)
    return response


async def _async_send(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    request = args[0] if args else kwargs.get("request")
    cr = _start_span(request) if request is not None else None
    if cr is None:
        return await wrapped(*args, **kwargs)
    token = _in_client_span.set(True)
    try:
        response = await wrapped(*args, **kwargs)
    except BaseException as exc:
        cr.finish(exc)
        raise
    finally:
        _in_client_span.reset(token)
    _after_response(cr, response, bool(kwargs.get("stream", False)), async_=True)
    return response


def has_wrapper(value: Any, wrapper: Any) -> bool:
    """Whether `wrapper` is one of the `wrapt` layers of `value` (ours under another's)."""
    while isinstance(value, wrapt.FunctionWrapper):
        if getattr(value, "_self_wrapper", None) is wrapper:
            return True
        value = value.__wrapped__
    return False


def remove_wrapper(owner: Any, name: str, wrapper: Any) -> bool:
    """Removes our `wrapt` layer (`wrapper`) from `owner.<name>` (in its own `__dict__`),
    leaving any other library's layers, above or below it, in place; gives whether one
    was found.  Taking the top one off blindly would take off whatever was wrapped
    after us and leave ours on."""
    current = vars(owner).get(name)
    if not isinstance(current, wrapt.FunctionWrapper):
        return False
    if getattr(current, "_self_wrapper", None) is wrapper:
        setattr(owner, name, current.__wrapped__)  # ours on top: what it wrapped goes back
        return True
    outer, inner = current, current.__wrapped__
    while isinstance(inner, wrapt.FunctionWrapper):
        if getattr(inner, "_self_wrapper", None) is wrapper:
            outer.__wrapped__ = inner.__wrapped__  # ours under another's: spliced out
            return True
        outer, inner = inner, inner.__wrapped__
    return False


def _package_of(response: Any) -> str:
    """Gives the httpx-API package `response` comes from: an httpx2 response takes
    httpx2's stream types."""
    for cls in type(response).__mro__:
        package = cls.__module__.partition(".")[0]
        if package in HTTPX_MODULES:
            return package
    return "httpx"


def _installed_modules() -> list[Any]:
    """Gives the httpx-API packages installed (importing only those that are)."""
    return [
        importlib.import_module(name)
        for name in HTTPX_MODULES
        if importlib.util.find_spec(name) is not None
    ]


def instrument_httpx(client: Any = None) -> Any:
    """Traces every request of `client` (an httpx / httpx2 Client or AsyncClient), or of
    all clients of both packages when None."""
    global _classes_instrumented

    if client is None:
        if not _classes_instrumented:
            for httpx in _installed_modules():
                wrapt.wrap_function_wrapper(httpx.Client, "send", _sync_send)
                wrapt.wrap_function_wrapper(httpx.AsyncClient, "send", _async_send)
            _classes_instrumented = True
        return None
    wrapper = _async_send if inspect.iscoroutinefunction(client.send) else _sync_send
    if has_wrapper(vars(client).get("send"), wrapper):
        return client  # already instrumented
    # by what `send` is, not by class: httpx2's AsyncClient is no httpx.AsyncClient
    client.send = wrapt.FunctionWrapper(client.send, wrapper)
    return client


def uninstrument_httpx(client: Any = None) -> Any:
    """Undoes `instrument_httpx` for `client`, or for the classes when None."""
    global _classes_instrumented

    if client is None:
        if _classes_instrumented:
            for httpx in _installed_modules():
                remove_wrapper(httpx.Client, "send", _sync_send)
                remove_wrapper(httpx.AsyncClient, "send", _async_send)
            _classes_instrumented = False
        return None
    for wrapper in (_sync_send, _async_send):
        current = vars(client).get("send")
        if getattr(current, "_self_wrapper", None) is wrapper and not isinstance(
            current.__wrapped__, wrapt.FunctionWrapper
        ):
            del client.__dict__["send"]  # ours alone: the class's `send` again
        else:
            remove_wrapper(client, "send", wrapper)
    return client
