"""`tt.request(headers=...)` with headers as frameworks (or hosts) hand them over."""

from __future__ import annotations

import logging

import pytest

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def _trace_id(req: tt.RequestTrace) -> str:
    return format(req.span.get_span_context().trace_id, "032x")


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": PARENT},
        {"TRACEPARENT": PARENT},  # HTTP header names are case-insensitive
        {"Traceparent": PARENT, "TraceState": "k=v"},
        {"traceparent": PARENT.encode()},
        [(b"traceparent", PARENT.encode())],  # raw ASGI headers
        (("TraceParent", PARENT), ("x-bin", b"\x00")),  # gRPC metadata pairs
    ],
    ids=["lower", "upper", "title", "bytes-value", "raw-asgi", "pairs"],
)
def test_the_callers_trace_is_continued(memory_sdk, headers) -> None:  # type: ignore[no-untyped-def]
    with tt.request(headers=headers) as req:
        assert _trace_id(req) == TRACE_ID
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331


def test_tracestate_in_another_case_comes_along(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.request(headers={"TRACEPARENT": PARENT, "TraceState": "vendor=1"}) as req:
        pass
    assert req.span.get_span_context().trace_state.get("vendor") == "1"


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": 5},
        ["traceparent: " + PARENT],  # lines, not (name, value) pairs
        [("traceparent", PARENT, "extra")],
        {"traceparent": "zzz"},
        {"traceparent": None},
        object(),
    ],
    ids=["int-value", "list-of-str", "triples", "garbage", "none-value", "not-headers"],
)
def test_headers_it_cannot_read_start_a_new_trace(memory_sdk, headers, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING, logger="tokentrace")
    with tt.request(headers=headers, model="m") as req:
        req.token()
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.parent is None  # a new trace: the request itself is recorded
    assert span.attributes[sc.REQUEST_MODEL] == "m"
    assert PARENT not in caplog.text  # a header's value is never logged


def test_without_headers_nothing_changes(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    for headers in (None, {}, [], {"content-type": "application/json"}):
        with tt.request(headers=headers):
            pass
    assert all(s.parent is None for s in memory_sdk.spans(sc.SPAN_REQUEST))


@pytest.mark.parametrize(
    "headers",
    [None, ["traceparent: " + PARENT], [(b"traceparent", PARENT.encode())], {"TRACEPARENT": PARENT}],
    ids=["none", "list-of-str", "raw-asgi", "upper"],
)
def test_request_from_headers_takes_what_request_takes(memory_sdk, headers) -> None:  # type: ignore[no-untyped-def]
    """The plain function for other frameworks reads headers as `tt.request` does: it
    never raises into the host, and continues the caller's trace where it can."""
    with tt.request_from_headers(headers, model="m") as req:
        pass
    continued = _trace_id(req) == TRACE_ID
    assert continued == (headers is not None and not isinstance(headers, list) or
                         headers == [(b"traceparent", PARENT.encode())])  # fmt: skip
    assert memory_sdk.spans(sc.SPAN_REQUEST)
