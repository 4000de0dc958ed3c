"""A request that produced no token has no TTFT (tokentrace SDK spans, no token times).

Without token times the end of prefill stands in for the first token of a non-streamed
answer; it used to stand in also for a request that failed after its prefill and made no
token at all (the review's `zero_tokens_error`: TTFT 63 ms for a first token that never
came).
"""

from __future__ import annotations

import pytest

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import STATUS_ERROR, Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.instrumentation import semconv as sc

from . import spanfactory as f


def _request(
    *, output_tokens: int | None, failed: bool = False, failed_phase: bool = False
) -> RequestSummary:
    spans, _ = f.sdk_trace(2, 10, 50, 20, 10, offsets=False)  # prefill ends at 62 ms
    req = spans[0]
    assert req.name == sc.SPAN_REQUEST
    if output_tokens is None:
        del req.attributes[sc.OUTPUT_TOKENS]
    else:
        req.attributes[sc.OUTPUT_TOKENS] = output_tokens
    if failed:
        req.status_code = STATUS_ERROR
    if failed_phase:
        _phase(spans, sc.SPAN_PREFILL).status_code = STATUS_ERROR
    (r,) = summarize_trace(spans).requests
    return r


def _phase(spans: list[Span], name: str) -> Span:
    return next(x for x in spans if x.name == name)


def test_a_failed_request_that_says_nothing_of_its_tokens_has_no_ttft() -> None:
    r = _request(output_tokens=None, failed=True)
    assert r.error and r.ttft_ms is None


def test_a_failed_prefill_has_no_ttft() -> None:
    assert _request(output_tokens=None, failed_phase=True).ttft_ms is None


@pytest.mark.parametrize("failed", [False, True])
def test_a_request_that_produced_zero_tokens_has_no_ttft(failed: bool) -> None:
    assert _request(output_tokens=0, failed=failed).ttft_ms is None


@pytest.mark.parametrize(("output_tokens", "failed"), [(10, False), (None, False), (3, True)])
def test_a_request_that_made_tokens_keeps_the_end_of_prefill_as_its_ttft(
    output_tokens: int | None, failed: bool
) -> None:
    assert _request(output_tokens=output_tokens, failed=failed).ttft_ms == pytest.approx(62.0)
