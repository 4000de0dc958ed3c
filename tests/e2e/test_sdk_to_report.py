"""One instrumented request travels SDK → OTLP → collector → DuckDB → analyzer → report."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tokentrace import instrumentation as tt
from tokentrace.analyzer.report import build_report
from tokentrace.store.connection import open_read_only

TOKENIZE_S = 0.030
QUEUE_S = 0.060
PREFILL_S = 0.080
TOKENS = 10
ITL_S = 0.010
#: what a stored duration (ms) may differ by from the SDK's own: its rounding only
ROUNDING_MS = 0.01


def _one_request(i: int) -> dict[str, tuple[float, float]]:
    """Runs one request with sleep-timed phases; gives the bounds (ms) it measured of each.

    The SDK's clock (time.monotonic_ns) is read just before and just after each SDK call
    that marks a boundary, so each duration the SDK records lies between the inner and the
    outer bound: exact however long a loaded machine pauses between a reading and the
    call (a ±6 ms tolerance around one reading was not, once a pause fell in between).
    """
    clock = time.monotonic_ns
    r0 = clock()  # before the request's start
    with tt.request(model="tiny", tenant=f"t{i % 2}", request_id=f"r{i}") as req:
        k0 = clock()
        with req.phase("tokenize"):
            k1 = clock()
            time.sleep(TOKENIZE_S)
            k2 = clock()
        k3 = clock()
        with req.phase("queue"):
            q1 = clock()
            time.sleep(QUEUE_S)
            q2 = clock()
        q3 = clock()
        p0 = clock()
        req.start_phase("prefill")
        p1 = clock()
        time.sleep(PREFILL_S)
        f0 = clock()
        req.token()
        req.end_phase("prefill")
        req.start_phase("decode")
        f1 = clock()
        for n in range(TOKENS - 1):
            time.sleep(ITL_S)
            if n == TOKENS - 2:
                l0 = clock()
            req.token()
        req.end_phase("decode")
        l1 = clock()
        req.set_tokens(prompt=42)
    e1 = clock()  # after the request's end

    def ms(lo: int, hi: int) -> float:
        return (hi - lo) / 1e6

    tokenize = (ms(k1, k2), ms(k0, k3))
    queue_wait = (ms(q1, q2), ms(k3, q3))
    # to the first token or to the prefill's end: both within these
    prefill = (ms(p1, f0), ms(p0, f1))
    decode = (ms(f1, l0), ms(f0, l1))
    return {
        "tokenize": tokenize,
        "queue_wait": queue_wait,
        # what is left of the request's span: its parts at least, at most its whole
        "queue": (tokenize[0] + queue_wait[0], ms(r0, e1) - prefill[0] - decode[0]),
        "prefill": prefill,
        "decode": decode,
    }


def _within(value: float, bounds: tuple[float, float]) -> bool:
    """Whether `value` (ms, as stored) lies within `bounds`, give or take its rounding."""
    return bounds[0] - ROUNDING_MS <= value <= bounds[1] + ROUNDING_MS


@pytest.fixture
def sdk(serve):  # type: ignore[no-untyped-def]
    tracing = tt.configure(endpoint=serve.otlp_http, service_name="e2e-test")
    yield tracing
    tt.shutdown()


def test_buckets_match_known_phase_durations(serve, sdk) -> None:  # type: ignore[no-untyped-def]
    truths = {f"r{i}": _one_request(i) for i in range(4)}
    assert sdk.force_flush(10_000)
    serve.stop()

    conn = open_read_only(serve.db)
    try:
        report = build_report(conn)
        rows = conn.execute(
            "SELECT request_id, queue_ms, prefill_ms, decode_ms, tokenize_ms, queue_wait_ms, e2e_ms, "
            "output_tokens, prompt_tokens, model, source FROM requests"
        ).fetchall()
    finally:
        conn.close()

    assert report["requests"]["count"] == 4
    assert len(rows) == 4
    for rid, queue, prefill, decode, tokenize, queue_wait, e2e, out, prompt, model, source in rows:
        truth = truths[rid]
        stored = {"prefill": prefill, "decode": decode, "tokenize": tokenize,
                  "queue_wait": queue_wait, "queue": queue}  # fmt: skip
        for name, value in stored.items():
            assert _within(value, truth[name]), (rid, name, value, truth[name])
        assert queue + prefill + decode == pytest.approx(e2e, abs=1e-6)
        assert (out, prompt, model, source) == (TOKENS, 42, "tiny", "tokentrace")
    prefills = [t["prefill"] for t in truths.values()]
    lowest, highest = min(lo for lo, _ in prefills), max(hi for _, hi in prefills)
    assert _within(report["buckets"]["prefill"]["p50"], (lowest, highest))
    assert report["buckets"]["network"]["measured"] is False
    # ITL percentiles come from a log histogram with ~12 % buckets; each gap is ITL_S or more
    # (a sleep never ends early: a pause only lengthens a gap, and the slowest mean with it)
    gaps_ms = [hi / (TOKENS - 1) for _, hi in (t["decode"] for t in truths.values())]
    assert ITL_S * 1000 * 0.85 <= report["latency"]["itl"]["p50"] <= max(gaps_ms) * 1.15


def test_report_and_requests_commands(serve, sdk, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _one_request(0)
    assert sdk.force_flush(10_000)
    serve.stop()
    run = [sys.executable, "-m", "tokentrace"]
    text = subprocess.run(
        [*run, "report", "--db", str(serve.db)], capture_output=True, text=True, check=True
    )
    assert "requests: 1" in text.stdout and "prefill" in text.stdout
    js = subprocess.run(
        [*run, "report", "--db", str(serve.db), "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(js.stdout)
    assert set(doc) >= {"requests", "latency", "buckets", "findings"}
    assert set(doc["latency"]) >= {"e2e", "ttft", "tpot", "itl"}
    lines = subprocess.run(
        [*run, "requests", "--db", str(serve.db)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    row = json.loads(lines[0])
    for col in ("trace_id", "request_id", "start", "e2e_ms", "network_ms", "queue_ms", "prefill_ms",
                "decode_ms", "ttft_ms", "tpot_ms", "itl_p99_ms", "itl_max_ms", "prompt_tokens",
                "output_tokens", "model", "tenant", "traffic_class", "source"):  # fmt: skip
        assert col in row
    csv = subprocess.run(
        [*run, "requests", "--db", str(serve.db), "--format", "csv"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert csv.splitlines()[0].startswith('"trace_id"')


def test_report_and_requests_keep_to_one_service(serve) -> None:  # type: ignore[no-untyped-def]
    for service, count in (("e2e-a", 2), ("e2e-b", 1)):
        tracing = tt.configure(endpoint=serve.otlp_http, service_name=service)
        for i in range(count):
            with tt.request(model="tiny", request_id=f"{service}-{i}") as req:
                req.token()
        assert tracing.force_flush(10_000)
    tt.shutdown()
    serve.stop()
    run = [sys.executable, "-m", "tokentrace"]

    def report(*flags: str) -> dict:  # type: ignore[type-arg]
        out = subprocess.run([*run, "report", "--db", str(serve.db), "--format", "json", *flags],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return json.loads(out)  # type: ignore[no-any-return]

    assert report()["requests"]["count"] == 3
    assert report("--service", "e2e-a")["requests"]["count"] == 2
    assert report("--service", "e2e-b")["requests"]["count"] == 1
    lines = subprocess.run([*run, "requests", "--db", str(serve.db), "--service", "e2e-a"],
                           capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    assert sorted(json.loads(line)["request_id"] for line in lines) == ["e2e-a-0", "e2e-a-1"]


def test_sdk_import_is_light() -> None:
    code = (
        "import sys, tokentrace.instrumentation\n"
        "print(','.join(m for m in ('duckdb','fastapi','polars','uvicorn','torch','starlette') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_malformed_otlp_gets_400(serve) -> None:  # type: ignore[no-untyped-def]
    import httpx

    url = f"{serve.otlp_http}/v1/traces"
    r = httpx.post(
        url, content=b"\x0a\xff\xff\xff", headers={"content-type": "application/x-protobuf"}
    )
    assert r.status_code == 400
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "invalid JSON" in r.json()["message"]
    r = httpx.post(url, json={"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]})
    assert r.status_code == 400
    r = httpx.post(url, content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    # still serving
    r = httpx.post(url, json={"resourceSpans": []})
    assert r.status_code == 200


def test_csv_cells_from_spans_never_become_spreadsheet_formulas(serve) -> None:  # type: ignore[no-untyped-def]
    # a model name, tenant or request id is whatever a sender wrote: opened in a
    # spreadsheet, `=HYPERLINK(...)` would be a live formula (OWASP CSV injection)
    tracing = tt.configure(endpoint=serve.otlp_http, service_name="csv")
    with tt.request(model='=HYPERLINK("http://x","y")', tenant="@acme", request_id="-1") as req:
        req.token()
    assert tracing.force_flush(10_000)
    tt.shutdown()
    serve.stop()
    import csv as csv_module
    import io

    out = subprocess.run(
        [sys.executable, "-m", "tokentrace", "requests", "--db", str(serve.db), "--format", "csv"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (row,) = csv_module.DictReader(io.StringIO(out))
    assert (row["model"], row["tenant"], row["request_id"]) == (
        "'=HYPERLINK(\"http://x\",\"y\")", "'@acme", "'-1",
    )  # fmt: skip
    assert float(row["e2e_ms"]) >= 0  # numbers stay numbers
