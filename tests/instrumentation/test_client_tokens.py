"""`client_request().set_tokens` never raises into the host, and never logs the value."""

from __future__ import annotations

import logging

import pytest

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _safety
from tokentrace.instrumentation import semconv as sc


def test_client_set_tokens_logs_a_value_that_is_no_number(memory_sdk, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_safety, "_seen", set())
    caplog.set_level(logging.WARNING, logger="tokentrace")
    with tt.client_request(model="m") as cr:
        cr.set_tokens(prompt="my secret prompt text", output=7)  # the text for its length: a slip
        cr.set_tokens(prompt="n/a", output=[1])
    (span,) = memory_sdk.spans(sc.SPAN_CLIENT)
    assert span.attributes[sc.OUTPUT_TOKENS] == 7 and sc.PROMPT_TOKENS not in span.attributes
    said = [r.getMessage() for r in caplog.records]
    assert sum("client set_tokens" in m for m in said) == 2, said  # each key once
    assert not any("secret" in m or "n/a" in m for m in said), said


def test_client_set_tokens_converts_numbers_given_as_text(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.client_request() as cr:
        cr.set_tokens(prompt="17", output=3.0)
    (span,) = memory_sdk.spans(sc.SPAN_CLIENT)
    assert (span.attributes[sc.PROMPT_TOKENS], span.attributes[sc.OUTPUT_TOKENS]) == (17, 3)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_client_set_tokens_takes_no_infinite_count(memory_sdk, value: float) -> None:  # type: ignore[no-untyped-def]
    with tt.client_request() as cr:
        cr.set_tokens(output=value)
    (span,) = memory_sdk.spans(sc.SPAN_CLIENT)
    assert sc.OUTPUT_TOKENS not in span.attributes
