"""Errors on spans without the text they may carry.

An exception's message often quotes its input: a validation error echoes the
request body, a tokenizer error the prompt.  The SDK records no prompt or
completion text unless configured with `record_content`, so without it an
error is recorded by its type and where it was raised (the traceback's frames),
not by its message.
"""

from __future__ import annotations

import traceback

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

#: OpenTelemetry's exception event and attribute names (semantic conventions)
EXCEPTION_EVENT = "exception"
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
EXCEPTION_STACKTRACE = "exception.stacktrace"
EXCEPTION_ESCAPED = "exception.escaped"


class HttpStatusError(RuntimeError):
    """An HTTP error status the SDK itself describes ("HTTP 503"): no content in it,
    so its message is recorded always."""


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def _frames_only(exc: BaseException) -> str:
    """Gives the traceback as Python prints it, but for the message (and chained exceptions)."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    return f"Traceback (most recent call last):\n{frames}{_type_name(exc)}\n"


def message_of(exc: BaseException) -> str | None:
    """Gives `str(exc)`, or None when the exception's own `__str__` fails."""
    try:
        return str(exc)
    except Exception:  # the host's exception class, not the SDK: its span must still be recorded
        return None


def record_error(span: trace.Span, exc: BaseException, record_content: bool) -> None:
    """Marks `span` as failed by `exc`: the whole exception with `record_content`,
    else its type and frames only (status description: the type's name)."""
    if record_content or type(exc) is HttpStatusError:
        message = message_of(exc)
        if message is None:
            # OpenTelemetry's record_exception would call str() again and raise:
            # its event, written here with a placeholder for the message
            message = f"<unprintable {type(exc).__name__} object>"
            cls = type(exc)
            span.add_event(
                EXCEPTION_EVENT,
                {
                    EXCEPTION_TYPE: cls.__qualname__
                    if cls.__module__ in ("builtins", None)
                    else f"{cls.__module__}.{cls.__qualname__}",
                    EXCEPTION_MESSAGE: message,
                    EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exc)),
                    EXCEPTION_ESCAPED: "False",
                },
            )
        else:
            span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"))
        return
    span.add_event(
        EXCEPTION_EVENT,
        {EXCEPTION_TYPE: _type_name(exc), EXCEPTION_STACKTRACE: _frames_only(exc)},
    )
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
