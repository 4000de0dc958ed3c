"""The ASGI middleware's edges under a real uvicorn: probe routes, instrumenting an app
that has started, a handler that is cancelled."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from tt_testkit import free_port

from tests.instrumentation._http_app import run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _safety
from tokentrace.instrumentation import semconv as sc

PROBES = ("/health", "/healthz", "/readyz", "/livez", "/ping", "/metrics")


def _app() -> FastAPI:
    app = FastAPI()
    for path in PROBES:
        app.add_api_route(path, lambda: {"ok": True})

    @app.post("/v1/completions")
    async def completions() -> dict[str, bool]:
        req = tt.current_request()
        if req is not None:
            req.token()
        return {"traced": req is not None}

    @app.get("/cancel")
    async def cancel() -> None:
        raise asyncio.CancelledError()

    return app


def _by_path(spans: list[Any]) -> list[tuple[str, bool]]:
    spans = sorted(spans, key=lambda s: s.start_time)
    return [(s.attributes[sc.URL_PATH], bool(s.attributes.get(sc.COLD_START))) for s in spans]


def test_probes_are_not_traced_and_leave_the_cold_start_to_real_requests(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    app = tt.instrument_fastapi(_app())
    with run_app(app, free_port()) as url:
        for path in PROBES:  # an orchestrator's probes, before the first real request
            assert httpx.get(url + path).status_code == 200
        assert httpx.post(url + "/v1/completions").json() == {"traced": True}
        assert httpx.post(url + "/v1/completions").status_code == 200
        spans = memory_sdk.wait_for(sc.SPAN_REQUEST, 2)
    assert _by_path(spans) == [("/v1/completions", True), ("/v1/completions", False)]


def test_exclude_paths_replaces_the_probe_list(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    app = tt.instrument_fastapi(_app(), exclude_paths="/metrics")  # one path, as text
    with run_app(app, free_port()) as url:
        assert httpx.get(url + "/metrics").status_code == 200
        assert httpx.get(url + "/health").status_code == 200
        spans = memory_sdk.wait_for(sc.SPAN_REQUEST, 1)
    assert _by_path(spans) == [("/health", True)]


@pytest.fixture
def fresh_log_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Any:
    monkeypatch.setattr(_safety, "_seen", set())
    caplog.set_level(logging.WARNING, logger="tokentrace")
    return caplog


def _traced(url: str) -> bool:
    return bool(httpx.post(url + "/v1/completions").json()["traced"])


@pytest.mark.slow
def test_instrumenting_an_app_that_has_started(memory_sdk, fresh_log_once) -> None:  # type: ignore[no-untyped-def]
    plain = _app()

    @plain.get("/traced")
    async def traced() -> dict[str, bool]:
        return {"traced": tt.current_request() is not None}

    with run_app(plain, free_port()) as url:
        assert httpx.get(url + "/traced").json() == {"traced": False}
        assert tt.instrument_fastapi(plain) is plain  # Starlette refuses: logged, not raised
        assert httpx.get(url + "/traced").json() == {"traced": False}
    assert "call instrument_fastapi(app) before it serves" in fresh_log_once.text

    app = tt.instrument_fastapi(_app())
    with run_app(app, free_port()) as url:
        assert _traced(url)
        tt.uninstrument_fastapi(app)  # on the running app: its middleware pauses
        assert not _traced(url)
        tt.instrument_fastapi(app)  # and resumes
        assert _traced(url)
        assert len(memory_sdk.wait_for(sc.SPAN_REQUEST, 2)) == 2


def test_a_cancelled_handler_records_the_500_the_client_got(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    app = tt.instrument_fastapi(_app())
    with run_app(app, free_port(), log_level="critical") as url:
        assert httpx.get(url + "/cancel").status_code == 500  # uvicorn's answer
        (span,) = memory_sdk.wait_for(sc.SPAN_REQUEST)
    assert span.attributes[sc.HTTP_STATUS] == 500
    assert not span.status.is_ok
