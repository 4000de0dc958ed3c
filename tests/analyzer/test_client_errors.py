"""Errors only a client saw: a stream cut short with no server span is an error row, and the
report counts it (issue 22: vLLM sends no span for an aborted request, and "errors: 0" was
wrong).  The real recording is tests/engines' client_errors; these are its shapes."""

from __future__ import annotations

from typing import Any

import pytest

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import STATUS_ERROR, Span
from tokentrace.analyzer.summary import FLAG_STREAM_ABORTED

from .spanfactory import genai_client_trace


def _client(attributes: dict[str, Any], status: int = 0) -> list[Span]:
    """Gives an OpenLLMetry chat stream of 5 chunks with `attributes` added to its span."""
    spans, _ = genai_client_trace(80.0, 10.0, 5)
    spans[0].attributes.update(attributes)
    spans[0].status_code = status
    return spans


@pytest.mark.parametrize(
    ("attributes", "status", "error", "aborted"),
    [
        # the stream ended without a finish reason: the client closed it
        ({"gen_ai.is_streaming": True}, 0, True, True),
        ({"llm.is_streaming": "true"}, 0, True, True),
        # a finished stream, in each instrumentation's words
        ({"gen_ai.is_streaming": True, "gen_ai.response.finish_reasons": ["stop"]}, 0, False, False),
        ({"llm.is_streaming": True, "gen_ai.completion.0.finish_reason": "length"}, 0, False, False),
        # an empty finish reason is none (OpenLLMetry writes "" into its output messages)
        ({"gen_ai.is_streaming": True, "gen_ai.response.finish_reasons": [""]}, 0, True, True),
        # a call that does not say it streamed (openai-v2 sets no finish reason on streams)
        ({}, 0, False, False),
        # a 400 is an error by its status, not an abort
        ({"gen_ai.is_streaming": True, "error.type": "BadRequestError"}, STATUS_ERROR, True, False),
    ],
)
def test_a_stream_cut_short_without_a_server_span_is_an_error(
    attributes: dict[str, Any], status: int, error: bool, aborted: bool
) -> None:
    (row,) = summarize_trace(_client(attributes, status)).requests
    assert row.error is error
    assert (FLAG_STREAM_ABORTED in row.flags) is aborted
