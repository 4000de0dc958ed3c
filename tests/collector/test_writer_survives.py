"""The single DuckDB writer thread survives what it is handed: a row DuckDB will
not take costs that row only (counted, logged once with DuckDB's reason), an
unexpected error costs one round, and should the thread die anyway the store
is reported unwritable (/readyz 503, `tokentrace_store_writable` 0, exports
refused), never acknowledged and lost.

Reproduces the security review's `writer_crash.py` / `writer_crash_proto.py`:
a round holding a single bad row (a lone UTF-16 surrogate in a string, an
engine step's 2**40 prefill tokens in an INTEGER column) killed the thread
with an IndexError (`errors[0]` of an empty list)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from otlp_traces import request_trace, to_json

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.store.connection import open_db

#: Bounded waits: on the old code the writer thread is dead and nothing is written.
FLUSH_S = 10.0


def _step(prefill_tokens: int, start_ns: int = 1_700_000_000_000_000_000) -> EngineStep:
    return EngineStep(
        service="engine", instance="i-1", start_ns=start_ns, duration_us=1000,
        prefill_tokens=prefill_tokens, decode_seqs=1, batch_size=2, queue_depth=0,
    )  # fmt: skip


def _requests(service: str, **fields: Any) -> list[Any]:
    rows = summarize_trace(request_trace(service=service)).requests
    for name, value in fields.items():
        setattr(rows[0], name, value)
    return rows


@pytest.fixture
def writer(tmp_path: Path) -> Any:
    conn = open_db(tmp_path / "w.duckdb")
    w = Writer(conn)
    try:
        yield w
    finally:
        w.close(timeout=5)
        conn.close()


def _services(writer: Writer) -> list[str]:
    writer.flush(timeout=FLUSH_S)
    cur = writer._conn.cursor()
    try:
        return [r[0] for r in cur.execute("SELECT service FROM requests ORDER BY service").fetchall()]
    finally:
        cur.close()


@pytest.mark.parametrize(
    "bad",
    [
        # a lone surrogate: pyarrow cannot encode the str as UTF-8 (UnicodeEncodeError)
        pytest.param(lambda: WriteBatch(requests=_requests("bad", tenant="\ud800")), id="surrogate"),
        # 2**40 in an INTEGER column: DuckDB's ConversionException
        pytest.param(lambda: WriteBatch(engine_steps=[_step(2**40)]), id="integer-overflow"),
    ],
)
def test_a_round_of_one_bad_row_drops_that_row_and_the_writer_goes_on(
    writer: Writer, bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    assert writer.submit(bad())
    writer.flush(timeout=FLUSH_S)  # alone in its round: a single piece to bisect
    assert writer.submit(WriteBatch(requests=_requests("later")))
    assert _services(writer) == ["later"]
    assert writer.write_errors == 1
    assert writer.store_writable and writer.store_error is None
    assert writer._thread.is_alive()
    dropped = [r for r in caplog.records if "would not take" in r.getMessage()]
    assert len(dropped) == 1
    # the reason DuckDB (or pyarrow) gave, with its traceback
    assert any(word in dropped[0].getMessage() for word in ("UnicodeEncodeError", "ConversionException"))
    assert dropped[0].exc_info is not None
    assert "IndexError" not in caplog.text


def test_bad_rows_keep_the_rest_of_their_batch_and_are_logged_once(
    writer: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    for n in range(3):
        batch = WriteBatch(
            requests=_requests(f"good{n}") + _requests(f"bad{n}", tenant="x\udc80y"),
            engine_steps=[_step(7), _step(2**40)],
        )
        assert writer.submit(batch)
        writer.flush(timeout=FLUSH_S)
    assert _services(writer) == ["good0", "good1", "good2"]
    cur = writer._conn.cursor()
    assert cur.execute("SELECT prefill_tokens FROM engine_steps").fetchall() == [(7,)] * 3
    cur.close()
    assert writer.write_errors == 6
    # three rounds with bad rows, one line (a sender repeating a bad value does not flood the log)
    assert len([r for r in caplog.records if "would not take" in r.getMessage()]) == 1


def test_the_writer_keeps_running_after_an_unexpected_error(
    writer: Writer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    real = writer._write_items
    calls: list[int] = []

    def broken_once(items: list[WriteBatch]) -> None:
        calls.append(len(items))
        if len(calls) == 1:
            raise KeyError("a bug in the writer")
        real(items)

    monkeypatch.setattr(writer, "_write_items", broken_once)
    assert writer.submit(WriteBatch(requests=_requests("lost")))
    writer.flush(timeout=FLUSH_S)
    assert writer.submit(WriteBatch(requests=_requests("later")))
    assert _services(writer) == ["later"]
    assert writer._thread.is_alive() and writer.store_writable
    assert "unexpected" in caplog.text and "a bug in the writer" in caplog.text


class _ThreadKilled(BaseException):
    """What no `except Exception` catches: stands for whatever might still end the thread."""


def test_a_dead_writer_thread_is_reported_not_hidden(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from collector_testkit import start_live

    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    live, stop = start_live(tmp_path, grace_s=0.05)
    try:
        writer = live.collector.writer
        assert httpx.get(f"{live.http}/readyz", timeout=5).status_code == 200

        def killed(items: list[WriteBatch]) -> None:
            raise _ThreadKilled("the writer thread ends")

        writer._write_items = killed  # type: ignore[method-assign]
        r = httpx.post(f"{live.http}/v1/traces", json=to_json(request_trace()), timeout=10)
        assert r.status_code == 200
        deadline = time.monotonic() + 20
        while writer._thread.is_alive() and time.monotonic() < deadline:
            live.collector.pipeline.decide_ready(force=True)
            time.sleep(0.05)
        assert not writer._thread.is_alive()

        ready = httpx.get(f"{live.http}/readyz", timeout=5)
        assert ready.status_code == 503
        assert ready.headers["Retry-After"] == "1"
        assert "writer thread stopped" in ready.json()["reason"]
        metrics = httpx.get(f"{live.http}/metrics", timeout=5).text
        assert "tokentrace_store_writable 0.0" in metrics.splitlines()
        # nothing more is acknowledged: senders keep their data and retry
        r = httpx.post(f"{live.http}/v1/traces", json=to_json(request_trace()), timeout=10)
        assert r.status_code == 503
        assert "writer thread stopped" in r.json()["message"]
        assert "writer thread stopped" in caplog.text  # logged, with the traceback
    finally:
        stop()
