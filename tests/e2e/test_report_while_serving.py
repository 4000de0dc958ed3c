"""`tokentrace report` while `tokentrace serve` holds the database: ask the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from tt_testkit import ServeProcess, start_serve

from tokentrace import instrumentation as tt
from tokentrace.store.serve_note import note_path, read_note, write_note

TOKEN = "report-token"


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return _cli("report", *args)


def _cli(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokentrace", command, *args], capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One real `serve` with an API token for the module; each test sends its own service."""
    server = start_serve(tmp_path_factory.mktemp("serving"), "--grace-s", "0.1", "--api-token", TOKEN)
    try:
        yield server
    finally:
        server.stop()
    assert not note_path(server.db).exists()  # a stopped serve takes its note away


def _send(serve: ServeProcess, service: str, requests: list[tuple[str, str, int]]) -> None:
    """Sends these (request id, model, tokens) requests of `service` to `serve`."""
    tracing = tt.configure(endpoint=serve.otlp_http, service_name=service)
    try:
        for request_id, model, tokens in requests:
            with tt.request(model=model, request_id=request_id) as req:
                req.token(tokens)
        assert tracing.force_flush(10_000)
    finally:
        tt.shutdown()


def test_report_by_url_while_serve_holds_the_db(serve: ServeProcess) -> None:
    _send(serve, "remote-report", [(f"r{i}", "tiny", 2) for i in range(3)])
    own_service = ("--service", "remote-report")  # the module's other tests send to the same serve
    held = _report("--db", str(serve.db))
    assert held.returncode == 1
    # the error says what to do instead, with this server's own address
    assert f"--url {serve.web} --token TOKEN" in held.stderr, held.stderr
    assert note_path(serve.db).is_file()

    unauthorized = _report("--url", serve.web, "--format", "json")
    assert unauthorized.returncode == 1 and "401" in unauthorized.stderr

    otlp_port = _report("--url", serve.otlp_http, "--token", TOKEN, "--format", "json")
    assert otlp_port.returncode == 1 and "404" in otlp_port.stderr
    assert "web UI's address" in otlp_port.stderr  # the usual mistake, named

    deadline_runs = 0
    while True:  # the decision grace and the report cache make the count catch up
        ok = _report("--url", serve.web, "--token", TOKEN, "--format", "json", *own_service)
        assert ok.returncode == 0, ok.stderr
        doc = json.loads(ok.stdout)
        if doc["requests"]["count"] == 3 or deadline_runs > 40:
            break
        deadline_runs += 1
    assert doc["requests"]["count"] == 3
    assert set(doc) >= {"requests", "latency", "buckets", "findings"}

    only_other = _report(
        "--url", serve.web, "--token", TOKEN, "--format", "json", "--model", "other", *own_service
    )
    assert json.loads(only_other.stdout)["requests"]["count"] == 0
    for service, count in (("remote-report", 3), ("another-service", 0)):
        one = _report("--url", serve.web, "--token", TOKEN, "--format", "json", "--service", service)
        assert json.loads(one.stdout)["requests"]["count"] == count, one.stderr


def test_a_note_of_a_serve_that_is_gone_is_ignored(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    write_note(db, "http://127.0.0.1:9", token_required=False)
    assert read_note(db) == {"pid": os.getpid(), "web": "http://127.0.0.1:9", "token": False}
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    note_path(db).write_text(json.dumps({"pid": int(dead.stdout), "web": "http://127.0.0.1:9"}))
    assert read_note(db) is None  # its process exited: no stale address in the hint
    note_path(db).write_text("{not json")
    assert read_note(db) is None


def test_requests_by_url_while_serve_holds_the_db(serve: ServeProcess, tmp_path: Path) -> None:
    _send(serve, "remote-requests", [(f"q{i}", "tiny" if i else "other", 1) for i in range(3)])
    # the module's other tests send to the same serve: only this service's rows
    auth = ("--url", serve.web, "--token", TOKEN, "--service", "remote-requests")

    held = _cli("requests", "--db", str(serve.db))
    assert held.returncode == 1 and "tokentrace requests --url" in held.stderr

    rows: list[dict[str, object]] = []
    for _ in range(100):  # the decision grace: rows land a moment after the export
        ok = _cli("requests", *auth)
        assert ok.returncode == 0, ok.stderr
        rows = [json.loads(line) for line in ok.stdout.splitlines()]
        if len(rows) == 3:
            break
    assert sorted(r["request_id"] for r in rows) == ["q0", "q1", "q2"]
    assert all(r["output_tokens"] == 1 and r["start"].endswith("Z") for r in rows)

    csv = _cli("requests", *auth, "--format", "csv", "--model", "tiny")
    assert csv.returncode == 0, csv.stderr
    lines = csv.stdout.splitlines()
    assert "request_id" in lines[0] and len(lines) == 3  # header + the two "tiny" requests

    out = tmp_path / "requests.parquet"
    out.write_bytes(b"an earlier export")
    refused = _cli("requests", "--url", serve.web, "--format", "parquet", "--output", str(out))
    assert refused.returncode == 1 and "401" in refused.stderr
    assert out.read_bytes() == b"an earlier export"  # a failed export leaves it as it was
    assert not (tmp_path / "requests.parquet.part").exists()
    ok = _cli("requests", *auth, "--format", "parquet", "--output", str(out), "--limit", "2")
    assert ok.returncode == 0, ok.stderr
    assert pq.read_table(out).num_rows == 2

    headers = {"Authorization": f"Bearer {TOKEN}"}
    bad = httpx.get(f"{serve.web}/api/requests.xml", headers=headers)
    assert bad.status_code == 400 and "format must be one of" in bad.json()["error"]
    bad = httpx.get(f"{serve.web}/api/requests.csv", params={"limit": "0"}, headers=headers)
    assert bad.status_code == 400 and "limit" in bad.json()["error"]
