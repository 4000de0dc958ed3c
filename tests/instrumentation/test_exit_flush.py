"""Processes that end without atexit still send their last spans: uvicorn stopped by
SIGTERM (it raises the signal again after its graceful shutdown) and multiprocessing
children (they end with `os._exit`)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap

import httpx
import pytest
from tt_testkit import free_port, wait_for_port

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc

_UVICORN_APP = """
import sys
import uvicorn
from fastapi import FastAPI
from tokentrace import instrumentation as tt

tt.configure(endpoint=sys.argv[1], service_name="sigterm-app")
app = FastAPI()
tt.instrument_fastapi(app)

@app.get("/gen")
async def gen():
    req = tt.current_request()
    req.start_phase("prefill"); req.token(); req.end_phase("prefill")
    return {"ok": True}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def _span_names(serve, trace_ids: list[str]) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """Gives the stored span names of each trace (`serve` stopped)."""
    got: dict[str, list[str]] = {t: [] for t in trace_ids}
    for trace_id, name in serve.rows(
        "SELECT trace_id, name FROM spans WHERE list_contains(?, trace_id)", [trace_ids]
    ):
        got[str(trace_id)].append(str(name))
    return got


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix", reason="POSIX signals")
def test_uvicorn_stopped_by_sigterm_sends_the_last_requests(serve) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _UVICORN_APP, serve.otlp_http, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, proc=proc)
        trace_id = secrets.token_hex(16)
        answer = httpx.get(
            f"http://127.0.0.1:{port}/gen",
            headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
        )
        assert answer.status_code == 200
        proc.send_signal(signal.SIGTERM)  # at once: the span still waits in the SDK
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # uvicorn raised the SIGTERM again after its shutdown: no atexit ran
    assert proc.returncode == -signal.SIGTERM, out.decode()
    serve.stop()
    names = _span_names(serve, [trace_id])[trace_id]
    assert sorted(names) == [sc.SPAN_PREFILL, sc.SPAN_REQUEST], out.decode()


def test_the_sdk_goes_on_after_an_apps_lifespan_ends(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """The lifespan shutdown flushes, it does not shut the SDK down: a host may serve
    again (Starlette's TestClient runs a lifespan per `with`)."""
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    app = FastAPI()
    tt.instrument_fastapi(app)

    @app.get("/gen")
    async def gen() -> dict[str, bool]:
        return {"traced": tt.current_request() is not None}

    for _ in range(2):
        with TestClient(app) as client:
            assert client.get("/gen").json() == {"traced": True}
    assert tt.get_tracing() is memory_sdk.tracing and not memory_sdk.tracing.closed
    assert len(memory_sdk.spans(sc.SPAN_REQUEST)) == 2


_WORKERS = """
import multiprocessing as mp, sys
from tokentrace import instrumentation as tt

tt.configure(endpoint=sys.argv[1], service_name="mp-workers")

def work(tag):
    with tt.request(model=tag) as req:
        req.start_phase("prefill"); req.token(); req.end_phase("prefill")
        return format(req.span.get_span_context().trace_id, "032x")

def process_target(queue):
    queue.put([work("process") for _ in range(2)])  # returns: no tt.shutdown() here

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    process = ctx.Process(target=process_target, args=(queue,))
    process.start()
    ids = queue.get(timeout=60)
    process.join(60)
    pool = ctx.Pool(2)
    ids += pool.map(work, ["pool-a", "pool-b", "pool-c", "pool-d"])
    pool.close()
    pool.join()  # the workers end on their own (terminate() would kill them by SIGTERM)
    print(" ".join(ids), flush=True)
    tt.shutdown()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_multiprocessing_workers_send_their_last_spans(serve) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WORKERS), serve.otlp_http],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    trace_ids = proc.stdout.decode().split()
    assert len(trace_ids) == 6
    serve.stop()
    names = _span_names(serve, trace_ids)
    assert {t: sorted(n) for t, n in names.items()} == {
        t: [sc.SPAN_PREFILL, sc.SPAN_REQUEST] for t in trace_ids
    }, proc.stderr.decode()
