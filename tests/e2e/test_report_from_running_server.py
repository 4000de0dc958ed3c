"""`tokentrace report` while `tokentrace serve` holds the database: ask the server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tt_testkit import start_serve

from tokentrace import instrumentation as tt

TOKEN = "report-token"


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokentrace", "report", *args], capture_output=True, text=True)


def test_report_by_url_while_serve_holds_the_db(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, "--grace-s", "0.1", "--api-token", TOKEN)
    try:
        tracing = tt.configure(endpoint=serve.otlp_http, service_name="remote-report")
        try:
            for i in range(3):
                with tt.request(model="tiny", request_id=f"r{i}") as req:
                    req.token()
                    req.token()
            assert tracing.force_flush(10_000)
        finally:
            tt.shutdown()

        held = _report("--db", str(serve.db))
        assert held.returncode == 1
        assert "--url" in held.stderr  # the error says what to do instead

        unauthorized = _report("--url", serve.web, "--format", "json")
        assert unauthorized.returncode == 1 and "401" in unauthorized.stderr

        deadline_runs = 0
        while True:  # the decision grace and the report cache make the count catch up
            ok = _report("--url", serve.web, "--token", TOKEN, "--format", "json")
            assert ok.returncode == 0, ok.stderr
            doc = json.loads(ok.stdout)
            if doc["requests"]["count"] == 3 or deadline_runs > 40:
                break
            deadline_runs += 1
        assert doc["requests"]["count"] == 3
        assert set(doc) >= {"requests", "latency", "buckets", "findings"}

        only_other = _report("--url", serve.web, "--token", TOKEN, "--format", "json", "--model", "other")
        assert json.loads(only_other.stdout)["requests"]["count"] == 0
    finally:
        serve.stop()
