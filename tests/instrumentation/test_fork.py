"""A forked worker (gunicorn --preload, multiprocessing's fork) is its own instance."""

from __future__ import annotations

import os

import pytest

from tokentrace import instrumentation as tt


def _one_request() -> None:
    with tt.request(model="m") as req:
        req.token()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_worker_exports_as_its_own_instance(serve_sdk) -> None:  # type: ignore[no-untyped-def]
    serve, tracing = serve_sdk  # configured in the parent, as a module-level configure() is
    _one_request()
    assert tracing.force_flush(10_000)
    pid = os.fork()
    if pid == 0:  # the worker: no configure() of its own
        code = 1
        try:
            _one_request()
            _one_request()
            tt.shutdown()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    serve.stop()
    rows = serve.rows("SELECT instance, cold_start FROM requests ORDER BY start_ns")
    # the parent's request, then the worker's two: as another instance (its own
    # service.instance.id and process.pid), its first a cold start (a new process
    # pays its initialization again)
    assert len(rows) == 3, rows
    (parent, parent_cold), (worker, worker_cold), (worker_again, warm) = rows
    assert worker == worker_again != parent
    assert (parent_cold, worker_cold, warm) == (True, True, False)
