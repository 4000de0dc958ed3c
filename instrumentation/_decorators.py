"""Decorators: a function run as a request, or timed as a phase of the current one.

Plain, async, generator and async generator functions alike: a streaming
body (a generator) is traced while it is iterated, not when it is called.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar, cast

from tokentrace.instrumentation import semconv
from tokentrace.instrumentation._request import RequestTrace, _current, request

_F = TypeVar("_F", bound=Callable[..., Any])


def phase(name: str) -> Callable[[_F], _F]:
    """Decorator: times each call as phase `name` of the current request.

    Works on plain and async functions; outside a request it just calls through.
    """

    def decorate(func: _F) -> _F:
        if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
            # a streaming body runs while it is iterated, not when it is called
            def phase_of_current() -> Any:
                req = _current.get()
                return nullcontext() if req is None else req.phase(name)

            return _around_generator(func, phase_of_current)
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                req = _current.get()
                if req is None:
                    return await func(*args, **kwargs)
                with req.phase(name):
                    return await func(*args, **kwargs)

            return cast(_F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            req = _current.get()
            if req is None:
                return func(*args, **kwargs)
            with req.phase(name):
                return func(*args, **kwargs)

        return cast(_F, wrapper)

    return decorate


def traced_request(name: str = semconv.SPAN_REQUEST, **request_kwargs: Any) -> Callable[[_F], _F]:
    """Decorator: runs each call inside a new request trace (sync or async).

    On a generator or async generator function (a streaming handler) the
    request spans the iteration: it starts at the first item asked for and
    ends when the generator is exhausted, closed or fails.
    """

    def decorate(func: _F) -> _F:
        if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
            return _traced_generator(func, lambda: request(name, **request_kwargs))
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with request(name, **request_kwargs):
                    return await func(*args, **kwargs)

            return cast(_F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with request(name, **request_kwargs):
                return func(*args, **kwargs)

        return cast(_F, wrapper)

    return decorate


def _around_generator(func: _F, around: Callable[[], AbstractContextManager[Any]]) -> _F:
    """Gives `func`, a generator or async generator function, run inside `around()`.

    Values sent in and exceptions thrown in are passed on to the generator.
    """
    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def async_gen_wrapper(*args: Any, **kwargs: Any) -> Any:
            with around():
                agen = func(*args, **kwargs)
                try:
                    item = await agen.__anext__()
                    while True:
                        try:
                            sent = yield item
                        except GeneratorExit:
                            raise
                        except BaseException as exc:  # thrown in: the generator's to handle
                            item = await agen.athrow(exc)
                        else:
                            item = await agen.asend(sent)
                except StopAsyncIteration:
                    return
                finally:
                    await agen.aclose()

        return cast(_F, async_gen_wrapper)

    @functools.wraps(func)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
        with around():
            return (yield from func(*args, **kwargs))

    return cast(_F, gen_wrapper)


def _traced_generator(func: _F, make_request: Callable[[], RequestTrace]) -> _F:
    """Gives `func`, a generator or async generator function, run as one request.

    The request starts with the first item asked for and ends with the last
    (or the close, or the error).  The consumer going away (the generator
    closed early, or the task reading it cancelled: a client disconnect) is
    no error: the request is marked `semconv.REQUEST_DISCONNECTED` and its status left unset;
    the exception goes on unchanged.  It is `current_request()` while the
    generator's body runs, each time it runs: a server may advance a stream
    in a context of its own per item (Starlette runs a sync stream's steps in
    a thread pool, each in a copied context), and between items the
    consumer's code is not inside the request.
    """
    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def async_gen_wrapper(*args: Any, **kwargs: Any) -> Any:
            req = make_request()
            error: BaseException | None = None
            agen = func(*args, **kwargs)
            try:
                advance, arg = agen.asend, None
                while True:
                    token = req._activate()
                    try:
                        item = await advance(arg)
                    except StopAsyncIteration:
                        return
                    finally:
                        req._deactivate(token)
                    try:
                        arg = yield item
                        advance = agen.asend
                    except GeneratorExit:
                        raise
                    except BaseException as exc:  # thrown in: the generator's to handle
                        advance, arg = agen.athrow, exc
            except BaseException as exc:
                error = exc
                raise
            finally:
                token = req._activate()
                try:
                    await agen.aclose()
                finally:
                    req._deactivate(token)
                    req._end(error)

        return cast(_F, async_gen_wrapper)

    @functools.wraps(func)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
        req = make_request()
        error: BaseException | None = None
        gen = func(*args, **kwargs)
        try:
            advance, arg = gen.send, None
            while True:
                token = req._activate()
                try:
                    item = advance(arg)
                except StopIteration as stop:
                    return stop.value
                finally:
                    req._deactivate(token)
                try:
                    arg = yield item
                    advance = gen.send
                except GeneratorExit:
                    raise
                except BaseException as exc:  # thrown in: the generator's to handle
                    advance, arg = gen.throw, exc
        except BaseException as exc:
            error = exc
            raise
        finally:
            token = req._activate()
            try:
                gen.close()
            finally:
                req._deactivate(token)
                req._end(error)

    return cast(_F, gen_wrapper)
