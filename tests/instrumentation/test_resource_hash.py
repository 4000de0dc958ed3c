"""The provider tokentrace makes hashes its resource once, not once a span at every export."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc


def test_the_otlp_encoder_does_not_hash_the_resource_again_for_every_span(
    memory_sdk, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    plain_hash = Resource.__hash__

    def counting_hash(self: Resource) -> int:
        nonlocal calls
        calls += 1
        return plain_hash(self)

    monkeypatch.setattr(Resource, "__hash__", counting_hash)
    for i in range(50):
        with tt.request(request_id=f"r{i}") as req:
            req.token()
    assert len(memory_sdk.otlp_bytes()) > 0  # OpenTelemetry's OTLP encoder groups by resource
    assert len(memory_sdk.spans(sc.SPAN_REQUEST)) == 50
    assert calls == 0  # a plain Resource: 50 JSON encodings of all its attributes, sorted


def test_the_resource_is_equal_to_a_plain_one_and_hashes_alike(memory_sdk) -> None:
    resource = memory_sdk.tracing.provider.resource
    plain = Resource(resource.attributes, resource.schema_url)
    assert resource.attributes["service.name"] == "sdk-test"
    assert resource == plain and plain == resource
    assert hash(resource) == hash(plain)
    assert len({resource, plain}) == 1  # grouped as one resource by anyone who groups
