"""OpenAI client integration: every `openai.OpenAI` / `AsyncOpenAI` client's httpx client is traced.

The `openai` package talks through an httpx client it builds (or the one given
as `http_client`); wrapping the clients' constructors instruments that httpx
client, so each API call gets a client span, `traceparent`, the request's
`model`, and chunk times when streamed.  `openai` is imported only here.
"""

from __future__ import annotations

from typing import Any

import wrapt

from tokentrace.instrumentation._httpx import instrument_httpx, remove_wrapper
from tokentrace.instrumentation._safety import log_once

_instrumented = False
_CLASSES = ("OpenAI", "AsyncOpenAI")


def _after_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    wrapped(*args, **kwargs)
    try:
        http_client = getattr(instance, "_client", None)
        if http_client is not None:
            instrument_httpx(http_client)
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("openai client instrumentation", exc)


def instrument_openai() -> None:
    """Traces every OpenAI client created from now on (raises ImportError without `openai`)."""
    global _instrumented
    import openai

    if _instrumented:
        return
    for name in _CLASSES:
        wrapt.wrap_function_wrapper(getattr(openai, name), "__init__", _after_init)
    _instrumented = True


def uninstrument_openai() -> None:
    """Undoes `instrument_openai` (clients already created stay traced)."""
    global _instrumented
    if not _instrumented:
        return
    import openai

    for name in _CLASSES:
        remove_wrapper(getattr(openai, name), "__init__", _after_init)  # ours only
    _instrumented = False
