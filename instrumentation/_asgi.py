"""Server side: an ASGI middleware (FastAPI / Starlette / any ASGI app) and a plain function.

The middleware is plain ASGI, so importing it pulls in neither Starlette nor
FastAPI.  It opens a request span per HTTP request, continuing an incoming
W3C `traceparent`, makes it `current_request()` for the handler (streaming
bodies included), sets `http.route` once the router has matched, and records
5xx answers and exceptions as errors (4xx answers are the client's: status
recorded, span status left unset, as OpenTelemetry's HTTP conventions say for
a server).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from tokentrace.instrumentation import semconv
from tokentrace.instrumentation._errors import HttpStatusError
from tokentrace.instrumentation._request import RequestTrace, request
from tokentrace.instrumentation._runtime import runtime
from tokentrace.instrumentation._safety import log_once

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_GUARD = "_tokentrace_instrumented"
#: set on an app uninstrumented after it started: its middleware passes requests through
_PAUSED = "_tokentrace_paused"
#: Scope key naming the request an outer TokentraceMiddleware opened: a mounted sub-app
#: instrumented too passes the request through instead of opening a second span for it.
SCOPE_KEY = "tokentrace.request"
#: Scope key for the exception an inner (pass-through) middleware saw leave the app.
ERROR_KEY = "tokentrace.error"
#: Lifespan scope key: an outer TokentraceMiddleware flushes at shutdown, the inner one not again.
LIFESPAN_KEY = "tokentrace.lifespan"
#: Seconds after the answer's last byte in which an exception leaving the app is still
#: the request's: Starlette's `BaseHTTPMiddleware` (`@app.middleware("http")`) sends a
#: streamed body's end and only then raises what cut the stream.  The request keeps the
#: last byte as its end; what the app still runs after the window (a long background
#: task) is not waited for.
LATE_ERROR_WINDOW_S = 1.0


def request_from_headers(
    headers: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None, **kwargs: Any
) -> RequestTrace:
    """Gives a request trace continuing the caller's `traceparent` from any framework's headers.

    `headers` is a mapping or (name, value) pairs, text or bytes (names
    case-insensitive); what cannot be read is logged once and the request starts
    a new trace.  Keyword arguments go to `request()`.
    """
    return request(headers=headers, **kwargs)


def _route_of(scope: Scope, app_root_path: str) -> str | None:
    """Gives the matched route template, from the app the middleware wraps.

    A router inside a `Mount` writes its own route (`/items/{id}`) over the
    mount's, and the mount's prefix only into `root_path`: the part of
    `root_path` added since the middleware ran is put back in front
    (`/sub/items/{id}`).  A mount's prefix is the path it matched, so a mount
    path with parameters shows their values.
    """
    route = scope.get("route")
    path = getattr(route, "path", None) or getattr(route, "path_format", None)
    if not path:
        return None
    root = str(scope.get("root_path", ""))
    prefix = root[len(app_root_path) :] if root.startswith(app_root_path) else ""
    if not prefix:
        return str(path)
    if hasattr(route, "routes"):
        return prefix  # the mount itself (a sub-app with no router): its prefix is its path
    return prefix + str(path)


class TokentraceMiddleware:
    """ASGI middleware: one tokentrace request span per HTTP request.

    `exclude_paths` are the app's paths it does not trace; by default the usual
    health, readiness and metrics probes (`DEFAULT_EXCLUDED_PATHS`): traced, an
    orchestrator's probe before the first real request took its cold-start mark,
    and probes every few seconds hid every idle gap.  A value given replaces the
    default (`()` traces every route; add to it with
    `[*TokentraceMiddleware.DEFAULT_EXCLUDED_PATHS, "/status"]`).
    """

    #: Probe routes not traced unless `exclude_paths` says otherwise (as OpenTelemetry's
    #: `OTEL_PYTHON_FASTAPI_EXCLUDED_URLS` is commonly set).
    DEFAULT_EXCLUDED_PATHS: frozenset[str] = frozenset(
        ("/health", "/healthz", "/readyz", "/livez", "/ping", "/metrics")
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        model: str | None = None,
        exclude_paths: Iterable[str] | None = None,
    ) -> None:
        self.app = app
        self.model = model
        if isinstance(exclude_paths, str):
            exclude_paths = (exclude_paths,)  # one path, not its characters
        self.exclude_paths = (
            self.DEFAULT_EXCLUDED_PATHS if exclude_paths is None else frozenset(exclude_paths)
        )

    def _excluded(self, scope: Scope) -> bool:
        if not self.exclude_paths:
            return False
        path = scope.get("path")
        if path in self.exclude_paths:
            return True
        # behind a `root_path` (uvicorn --root-path, a proxy's prefix) `path` carries it
        # (ASGI; uvicorn and Starlette do so): `/health` is excluded as `/api/health` too
        root = scope.get("root_path")
        return bool(
            root
            and isinstance(path, str)
            and path.startswith(root)
            and path[len(root) :] in self.exclude_paths
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if kind != "http" or self._excluded(scope) or getattr(scope.get("app"), _PAUSED, False):
            await self.app(scope, receive, send)  # websockets pass untouched
            return
        if SCOPE_KEY in scope:
            # a request an outer middleware traces already: `instrument_fastapi`'s own,
            # around Starlette's error handling, or a parent app's (a sub-app
            # instrumented as well).  An exception is noted for it here, before
            # Starlette's error handler answers for it (and then raises it again).
            try:
                await self.app(scope, receive, send)
            except Exception as exc:
                scope.setdefault(ERROR_KEY, exc)
                raise
            return
        try:
            headers = [
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", ())
            ]
            req = request_from_headers(
                headers,
                model=self.model,
                attributes={
                    semconv.HTTP_METHOD: str(scope.get("method", "")),
                    semconv.URL_PATH: str(scope.get("path", "")),
                },
            )
            app_root_path = str(scope.get("root_path", ""))
            scope[SCOPE_KEY] = req
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("ASGI request span", exc)
            await self.app(scope, receive, send)
            return
        status: list[int] = []
        #: [the request finished, the client went away before the answer's end]
        state = [False, False]
        #: the monotonic time of the answer's last byte, once sent
        answered: list[int] = []
        #: the timer that ends the request LATE_ERROR_WINDOW_S after its last byte
        late: list[asyncio.TimerHandle] = []

        def end(error: BaseException | None) -> None:
            if state[0]:
                return  # ended after the answer's last byte (a background task ran on)
            state[0] = True
            if late:
                late[0].cancel()
            if error is None and status and status[0] >= 500:
                # the exception an inner layer saw, answered by Starlette's error handler
                # (a 500, or what a handler for `Exception` sends); one answered below
                # 500 was handled further out (a parent app's handler for a sub-app's)
                error = scope.get(ERROR_KEY)
            try:
                route = _route_of(scope, app_root_path)
                if route:
                    req.set_attribute(semconv.ROUTE, route)
                if state[1] or (error is not None and _is_disconnect(error)):
                    # the client left: no server error (the exception still goes on)
                    req.set_attribute(semconv.REQUEST_DISCONNECTED, True)
                    error = None
                elif not status:
                    # nothing answered: the server (uvicorn, or Starlette's
                    # ServerErrorMiddleware where ours was added inside it with
                    # `add_middleware`) answers 500, whatever left the app: an
                    # exception, a cancellation (uvicorn catches BaseException), or
                    # none (an app that returned without answering)
                    status.append(500)
                if status:
                    req.set_attribute(semconv.HTTP_STATUS, status[0])
                    if status[0] >= 500 and error is None and not state[1]:
                        req.record_error(HttpStatusError(f"HTTP {status[0]}"))
            except Exception as exc:
                log_once("ASGI request attributes", exc)
            req._finish_at(answered[0] if answered else time.monotonic_ns(), error)

        async def receive_wrapper() -> Message:
            message = await receive()
            if message.get("type") == "http.disconnect" and not state[0]:
                state[1] = True  # before the answer's end: the client went away
            return message

        async def send_wrapper(message: Message) -> None:
            kind = message.get("type")
            if kind == "http.response.body":
                if message.get("more_body", False):
                    await send(message)  # a streamed chunk: nothing more to do
                    return
            elif kind == "http.response.start":
                status.append(int(message.get("status", 0)))
            elif kind != "http.response.pathsend":
                await send(message)
                return
            if kind != "http.response.start":
                # the answer's last byte: the request's end, whatever the app still
                # runs after it (Starlette's background tasks); read before the send,
                # which a client may see complete before it returns
                answered.append(time.monotonic_ns())
            try:
                await send(message)
            except OSError:  # the server could not write: the client is gone
                state[1] = True
                raise
            if kind != "http.response.start" and not state[0] and not late:
                # finished when the app returns (an exception raised after the body's
                # end is still this request's), or after the window, whichever first
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # not asyncio's loop (trio): finished now
                    end(None)
                else:
                    late.append(loop.call_later(LATE_ERROR_WINDOW_S, end, None))

        # current_request(), and OpenTelemetry's current span: a call the handler makes
        # (an instrumented httpx client, the host's own spans) is the request's child
        activation = req._activate()
        error: BaseException | None = None
        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        except BaseException as exc:
            error = exc
            raise  # unchanged
        finally:
            req._deactivate(activation)
            end(error)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Passes the app's lifespan through; flushes the SDK as its shutdown completes.

        uvicorn stopped by SIGTERM (a rollout, `docker stop`) drains the requests,
        runs the lifespan shutdown, then raises the signal again: the process dies
        by it and no atexit handler runs, so the last requests' spans would never
        leave.  They are built and sent here, before the server hears that the
        shutdown completed (bounded: `SHUTDOWN_TIMEOUT_S`).  The SDK stays
        configured: an app's lifespan may end while the process goes on
        (Starlette's `TestClient`, a program that serves again).
        """
        if LIFESPAN_KEY in scope:  # an outer TokentraceMiddleware flushes (instrument_fastapi)
            await self.app(scope, receive, send)
            return
        scope[LIFESPAN_KEY] = True

        async def send_wrapper(message: Message) -> None:
            if message.get("type") in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                try:
                    runtime.flush_before_exit()
                except Exception as exc:  # the SDK's own failure must never reach the host
                    log_once("flush at the app's lifespan shutdown", exc)
            await send(message)

        await self.app(scope, receive, send_wrapper)


def _is_disconnect(error: BaseException) -> bool:
    """Whether `error` says the client went away (Starlette's `ClientDisconnect`, raised
    when the server cannot write or the body cannot be read any more)."""
    return any(cls.__name__ == "ClientDisconnect" for cls in type(error).__mro__)


def instrument_fastapi(app: Any, **middleware_kwargs: Any) -> Any:
    """Adds `TokentraceMiddleware` to a FastAPI / Starlette app (before it starts); gives the app.

    It is listed in `app.user_middleware` as `add_middleware` lists it, and the
    one that traces goes around the whole stack, Starlette's `ServerErrorMiddleware`
    included (the listed one then passes the request through), so that the
    status recorded is the one sent: what an exception handler for `Exception`
    / 500 answers (a 503), or the 500 Starlette sends.
    """
    if getattr(app, _GUARD, False):
        return app
    if getattr(app, _PAUSED, False):
        # uninstrumented while it ran: its middleware is still in the stack, paused
        setattr(app, _PAUSED, False)
        setattr(app, _GUARD, True)
        return app
    if getattr(app, "middleware_stack", None) is not None:
        # Starlette refuses middleware once the app has served (its stack is built): left
        # as it is rather than raising into the host
        log_once(
            "instrument_fastapi on an app that has started",
            detail=": the app is left untraced; call instrument_fastapi(app) before it serves",
        )
        return app
    app.add_middleware(TokentraceMiddleware, **middleware_kwargs)
    build = getattr(app, "build_middleware_stack", None)
    if callable(build):

        def build_middleware_stack() -> ASGIApp:
            return TokentraceMiddleware(build(), **middleware_kwargs)

        build_middleware_stack._tokentrace_wraps = build  # type: ignore[attr-defined]
        try:
            app.build_middleware_stack = build_middleware_stack
        except Exception as exc:  # an app that refuses it: the listed middleware traces
            log_once("instrument_fastapi outermost middleware", exc)
    setattr(app, _GUARD, True)
    return app


def uninstrument_fastapi(app: Any) -> Any:
    """Removes the middleware added by `instrument_fastapi`; gives the app.

    On an app that has started, its middleware stack stays as built (rebuilding
    it would make every middleware of the host anew) and tokentrace's layers
    pass requests through until `instrument_fastapi(app)` resumes them.
    """
    if not getattr(app, _GUARD, False):
        return app
    if getattr(app, "middleware_stack", None) is not None:
        setattr(app, _PAUSED, True)
        setattr(app, _GUARD, False)
        return app
    if hasattr(vars(app).get("build_middleware_stack"), "_tokentrace_wraps"):
        del app.build_middleware_stack
    app.user_middleware = [m for m in app.user_middleware if m.cls is not TokentraceMiddleware]
    app.middleware_stack = None  # rebuilt on the next request
    setattr(app, _GUARD, False)
    return app
