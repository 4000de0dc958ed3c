"""`configure()` refuses a bad value with a clear ValueError, before anything is set up."""

from __future__ import annotations

from typing import Any

import pytest

from tokentrace import instrumentation as tt


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"endpoint": 4318}, "not the int 4318"),
        ({"endpoint": "http://"}, "with a host"),
        ({"endpoint": "http:///v1/traces"}, "with a host"),
        ({"endpoint": "ftp://collector:4318"}, "http:// or https://"),
        ({"endpoint": "http://collector:port"}, "not a valid URL"),
        ({"endpoint": "http://collector:99999"}, "not a valid URL"),
        ({"cold_start_requests": "two"}, "cold_start_requests must be a whole number"),
        ({"cold_start_idle_s": "long"}, "cold_start_idle_s must be a number"),
    ],
)
def test_bad_values_raise_a_clear_value_error(kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        tt.configure(service_name="bad", disabled=True, **kwargs)


def test_an_endpoint_with_blanks_around_it_is_read_without_them() -> None:
    try:
        tracing = tt.configure(endpoint=" http://127.0.0.1:4318\n", disabled=True)
        assert tracing.settings.endpoint == "http://127.0.0.1:4318"
    finally:
        tt.shutdown()


def test_a_bad_endpoint_from_the_environment_exports_nothing(monkeypatch, unconfigured) -> None:  # type: ignore[no-untyped-def]
    """Without configure(), the first request configures from the environment: a bad
    value there must not fail the request."""
    monkeypatch.setenv("TOKENTRACE_ENDPOINT", "http://")
    with tt.request(model="m") as req:
        req.token()
    assert tt.get_tracing().settings.disabled
