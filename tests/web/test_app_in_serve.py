"""The explorer inside a real `tokentrace serve`: SDK → OTLP → collector → the pages, live."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from tt_testkit import start_serve

from tokentrace import instrumentation as tt

TOKEN = "serve-token"


def _wait_for_requests(web: str, headers: dict[str, str], n: int) -> dict[str, object]:
    deadline = time.monotonic() + 20
    while True:
        data = httpx.get(f"{web}/api/search", headers=headers, timeout=10).json()
        if data["total"] >= n or time.monotonic() > deadline:
            return data  # type: ignore[no-any-return]
        time.sleep(0.1)


@pytest.mark.slow
def test_pages_read_the_live_collector_database(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, "--grace-s", "0.2", "--baseline", "1.0", "--api-token", TOKEN)
    try:
        sdk = tt.configure(endpoint=serve.otlp_http, service_name="web-serve-test")
        try:
            for i in range(3):
                with tt.request(model="tiny", tenant=f"t{i}") as req:
                    with req.phase("queue"):
                        time.sleep(0.01)
                    req.start_phase("prefill")
                    time.sleep(0.02)
                    req.token()
                    req.end_phase("prefill")
                    req.start_phase("decode")
                    for _ in range(4):
                        time.sleep(0.005)
                        req.token()
                    req.end_phase("decode")
            assert sdk.force_flush(10_000)
        finally:
            tt.shutdown()
        assert httpx.get(f"{serve.web}/api/search", timeout=10).status_code == 401
        headers = {"Authorization": f"Bearer {TOKEN}"}
        data = _wait_for_requests(serve.web, headers, 3)
        assert data["total"] == 3
        row = data["rows"][0]
        page = httpx.get(f"{serve.web}/trace/{row['trace_id']}", headers=headers, timeout=10)
        assert page.status_code == 200 and "tokentrace.request" in page.text
        trace = httpx.get(f"{serve.web}/api/trace/{row['trace_id']}", headers=headers, timeout=10).json()
        assert len(trace["requests"][0]["timeline"]["tokens"]) == 5
        overview = httpx.get(f"{serve.web}/api/overview", headers=headers, timeout=10).json()
        assert overview["report"]["requests"]["count"] == 3
    finally:
        serve.stop()
