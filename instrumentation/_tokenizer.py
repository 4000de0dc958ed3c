"""Tokenizer timing: any object with encode/decode, timed as request phases."""

from __future__ import annotations

import copy
import time
from types import CoroutineType
from typing import Any

import wrapt

from tokentrace.instrumentation._request import RequestTrace, _current

_current_request = _current.get  # one C call: this runs once per tokenizer call

#: Methods timed as "tokenize" / "detokenize"; everything else passes through untouched.
#: `apply_chat_template` is how a chat model's prompt becomes ids (it renders the
#: template and tokenizes inside the tokenizer, past the proxy).
TOKENIZE_METHODS = frozenset(
    {
        "encode",
        "encode_batch",
        "encode_plus",
        "batch_encode_plus",
        "__call__",
        "apply_chat_template",
    }
)
DETOKENIZE_METHODS = frozenset({"decode", "decode_batch", "batch_decode"})


def _timed_call(phase: str, fn: Any, request: RequestTrace | None, args: Any, kwargs: Any) -> Any:
    req = request if request is not None else _current_request()
    if req is None or phase in req._inside or phase in req._open:
        # outside a request; or inside the same phase already open on it (`with
        # req.phase("tokenize"): tok.encode(...)`, as the README shows, or a `start_phase`
        # not yet ended): that phase covers the call, and timed again here the request
        # would count it twice (two overlapping spans, or a doubled `.total_us`)
        return fn(*args, **kwargs)
    start = time.monotonic_ns()
    try:
        result = fn(*args, **kwargs)  # the user's exceptions pass through unchanged
    except BaseException:
        req._phases.append((phase, start, time.monotonic_ns()))
        raise
    if result.__class__ is CoroutineType:  # an async tokenizer: timed until it completes
        return _timed_await(phase, result, req, start)
    req._phases.append((phase, start, time.monotonic_ns()))
    return result


async def _timed_await(phase: str, coro: Any, req: RequestTrace, start: int) -> Any:
    try:
        return await coro
    finally:
        req._phases.append((phase, start, time.monotonic_ns()))


class _TimedMethod(wrapt.ObjectProxy):  # type: ignore[misc]
    """A bound tokenizer method that records its call as a phase."""

    def __init__(self, wrapped: Any, phase: str, request: RequestTrace | None) -> None:
        super().__init__(wrapped)
        self._self_phase = phase
        self._self_request = request

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _timed_call(self._self_phase, self.__wrapped__, self._self_request, args, kwargs)


class TokenizerProxy(wrapt.ObjectProxy):  # type: ignore[misc]
    """Behaves as the wrapped tokenizer; encode/decode calls are timed.

    A call made while the request already has that phase open (`with
    req.phase("tokenize")`, `@tt.phase("detokenize")`, `start_phase`) is not timed
    again: the open phase already holds its time.

    Sync calls are timed directly; an async tokenizer's (`async def encode`)
    until its coroutine completes, on the request current where it was called.
    `encode`, `decode` and calling the proxy are methods of the proxy itself (a
    request's usual two calls go straight to the tokenizer), present only where
    the tokenizer has them: the proxy is of a subclass made for what the
    tokenizer has (`hasattr(proxy, "decode")` and `callable(proxy)` answer as
    for the tokenizer).  The other timed names are made once, on first use.
    """

    def __new__(cls, wrapped: Any, request: RequestTrace | None = None) -> Any:
        if cls is TokenizerProxy:
            cls = _proxy_class(wrapped)
        return super().__new__(cls, wrapped)  # type: ignore[call-arg]

    def __init__(self, wrapped: Any, request: RequestTrace | None = None) -> None:
        super().__init__(wrapped)
        self._self_request = request
        #: timed methods made once: a proxy per call cost more than the tokenizer's own work
        self._self_timed: dict[str, _TimedMethod] = {}

    def __getattr__(self, name: str) -> Any:
        timed = self._self_timed.get(name)
        if timed is not None:
            return timed
        value = getattr(self.__wrapped__, name)
        phase = (
            "tokenize"
            if name in TOKENIZE_METHODS
            else "detokenize"
            if name in DETOKENIZE_METHODS
            else None
        )
        if phase is None:
            return value
        timed = self._self_timed[name] = _TimedMethod(value, phase, self._self_request)
        return timed

    # wrapt's proxy refuses copy and pickle (NotImplementedError); a tokenizer is
    # copied (`copy.deepcopy`, a Trainer) and pickled (a DataLoader worker under
    # spawn, `datasets.map(num_proc=...)`), so the proxy copies as a proxy of a copy.
    def __copy__(self) -> TokenizerProxy:
        return TokenizerProxy(copy.copy(self.__wrapped__), self._self_request)

    def __deepcopy__(self, memo: dict[int, Any]) -> TokenizerProxy:
        # the request is not copied: the copy times into the same one
        return TokenizerProxy(copy.deepcopy(self.__wrapped__, memo), self._self_request)

    def __reduce__(self) -> Any:
        # unpickled (in another process) as a proxy timing into that process's
        # current request: a request held explicitly does not travel
        return wrap_tokenizer, (self.__wrapped__,)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__reduce__()  # wrapt's proxy refuses both: pickle asks for this one


def _encode(self: TokenizerProxy, *args: Any, **kwargs: Any) -> Any:
    return _timed_call("tokenize", self.__wrapped__.encode, self._self_request, args, kwargs)


def _decode(self: TokenizerProxy, *args: Any, **kwargs: Any) -> Any:
    return _timed_call("detokenize", self.__wrapped__.decode, self._self_request, args, kwargs)


def _call(self: TokenizerProxy, *args: Any, **kwargs: Any) -> Any:
    # transformers tokenizers and plain callables tokenize when called
    return _timed_call("tokenize", self.__wrapped__, self._self_request, args, kwargs)


#: the proxy classes, one for each set of (encode, decode, callable) a tokenizer has
_proxy_classes: dict[tuple[bool, bool, bool], type[TokenizerProxy]] = {}


def _proxy_class(tokenizer: Any) -> type[TokenizerProxy]:
    """Gives the `TokenizerProxy` subclass with the methods `tokenizer` has (made once)."""
    has = (hasattr(tokenizer, "encode"), hasattr(tokenizer, "decode"), callable(tokenizer))
    cls = _proxy_classes.get(has)
    if cls is None:
        methods: dict[str, Any] = {"__module__": __name__, "__qualname__": "TokenizerProxy"}
        for present, name, method in zip(
            has, ("encode", "decode", "__call__"), (_encode, _decode, _call), strict=True
        ):
            if present:
                methods[name] = method
        cls = _proxy_classes[has] = type("TokenizerProxy", (TokenizerProxy,), methods)
    return cls


def wrap_tokenizer(tokenizer: Any, request: RequestTrace | None = None) -> Any:
    """Gives a proxy of `tokenizer` whose encode/decode time lands in the request's phases.

    The time goes to `request` when given, else to `current_request()`;
    outside a request the calls just pass through.
    """
    if isinstance(tokenizer, TokenizerProxy):
        return tokenizer
    if not (callable(tokenizer) or hasattr(tokenizer, "encode") or hasattr(tokenizer, "decode")):
        raise TypeError(
            f"wrap_tokenizer needs an object with encode/decode or a callable, not {type(tokenizer)!r}"
        )
    return TokenizerProxy(tokenizer, request)
