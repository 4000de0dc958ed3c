"""`serve --retention`: old rows of every table are deleted, new ones and kept traces'
spans stay, and ingestion running during a pass loses nothing."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from collector_testkit import LiveCollector, start_live
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from otlp_traces import T0, new_id, request_trace, to_protobuf

from tokentrace.analyzer.engine_starts import EngineStart
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.spans import Span
from tokentrace.cli import build_parser
from tokentrace.collector.collector import Collector
from tokentrace.collector.retention import TABLES, Retention, check_schema, parse_duration
from tokentrace.collector.settings import CollectorSettings, resolve
from tokentrace.collector.writer import KeptTrace, UnmatchedTrace, WriteBatch
from tokentrace.instrumentation import semconv as sc
from tokentrace.store.connection import open_db

PB = {"Content-Type": "application/x-protobuf"}
DAY_NS = 86_400 * 10**9
OLD = T0  # November 2023: far beyond any retention below


# ---- the setting -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604_800), ("36h", 129_600), ("90m", 5_400), ("45s", 45), ("1d12h", 129_600),
     (" 2H ", 7_200), ("1.5h", 5_400), ("1h30m15s", 5_415)],
)  # fmt: skip
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7", "3600", "0d", "0s", "-1d", "7w", "d", "7 days", "1h-2m", "", "1e3s", "nan"])
def test_bad_durations_fail_with_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="retention") as err:
        parse_duration(text)
    assert "\n" not in str(err.value)


def test_a_bare_number_is_refused_not_taken_as_seconds() -> None:
    with pytest.raises(ValueError, match="no unit"):
        CollectorSettings(retention="7")


def test_setting_default_flag_and_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert CollectorSettings().retention is None and CollectorSettings().retention_s is None
    assert CollectorSettings(retention="none").retention_s is None
    assert CollectorSettings(retention="7d").retention_s == 7 * 86_400
    monkeypatch.setenv("TOKENTRACE_RETENTION", "36h")
    assert resolve({"db": tmp_path / "a.duckdb"}).retention_s == 36 * 3_600
    assert resolve({"db": tmp_path / "a.duckdb", "retention": "90m"}).retention_s == 90 * 60
    monkeypatch.setenv("TOKENTRACE_RETENTION", "-3d")
    with pytest.raises(ValueError, match="retention"):
        resolve({"db": tmp_path / "a.duckdb"})  # at start-up, not in a thread later


def test_serve_help_shows_retention(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--retention RETENTION" in out
    assert "env TOKENTRACE_RETENTION; default none" in out
    assert "7d, 36h, 90m" in out and "a unit is required" in out


def test_every_data_table_of_the_store_has_a_time_column(tmp_path: Path) -> None:
    """A table added to the schema must be added to `TABLES` (or kept deliberately)."""
    conn = open_db(tmp_path / "s.duckdb")
    try:
        check_schema(conn)
        tables = {r[0] for r in conn.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert tables == {t.table for t in TABLES} | {"schema_version", "store_identity"}
    finally:
        conn.close()


def test_the_schema_check_refuses_a_store_without_the_time_column(tmp_path: Path) -> None:
    conn = duckdb.connect(str(tmp_path / "bare.duckdb"))
    try:
        conn.execute("CREATE TABLE requests (trace_id VARCHAR)")
        with pytest.raises(RuntimeError, match=r"requests\.start_ns"):
            check_schema(conn)
    finally:
        conn.close()


# ---- deletion through a real collector --------------------------------------------------


def _gpu_export(ts: int) -> bytes:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    kv = rm.resource.attributes.add()
    kv.key, kv.value.string_value = sc.SERVICE_NAME, "worker"
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = sc.METRIC_GPU_UTIL
    for gpu in (0, 1):
        dp = metric.gauge.data_points.add()
        dp.time_unix_nano, dp.as_double = ts, 50.0 + gpu
        a = dp.attributes.add()
        a.key, a.value.int_value = sc.GPU_INDEX, gpu
    return req.SerializeToString()


def _post(live: LiveCollector, path: str, body: bytes) -> None:
    for _ in range(200):
        r = httpx.post(f"{live.http}{path}", content=body, headers=PB)
        if r.status_code != 503:
            assert r.status_code == 200, r.text
            return
        time.sleep(0.05)
    raise AssertionError("the collector kept answering 503")


def _step(start_ns: int) -> EngineStep:
    return EngineStep("svc", "i-1", start_ns, 1_000, 10, 2, 3, 0, request_ids=["r"])


def _counts(live: LiveCollector, cutoff: int) -> dict[str, tuple[int, int]]:
    """(rows before the cutoff, rows at or after it) of every table."""
    return {
        t.table: live.rows(
            f"SELECT count(*) FILTER (WHERE {t.column} < ?), count(*) FILTER (WHERE {t.column} >= ?)"  # noqa: S608
            f" FROM {t.table}",
            [cutoff, cutoff],
        )[0]
        for t in TABLES
    }


@pytest.fixture
def kept_all(tmp_path: Path) -> Any:
    live, stop = start_live(tmp_path, baseline=1.0, retention="7d")  # every trace kept: spans stored
    try:
        # the pass at start, on the empty store, is over before a test writes: on a loaded
        # machine the thread ran it late, deleting the old rows the test sends before the
        # test could count them (and its own pass then found none)
        retention = live.collector.retention
        assert retention is not None
        deadline = time.monotonic() + 30
        while retention.passes < 1:
            assert time.monotonic() < deadline, "no retention pass at start"
            time.sleep(0.02)
        yield live
    finally:
        stop()


@pytest.mark.slow
def test_a_pass_deletes_old_rows_of_every_table_and_keeps_new_ones(
    kept_all: LiveCollector, caplog: pytest.LogCaptureFixture
) -> None:
    live = kept_all
    retention = live.collector.retention
    assert retention is not None
    now = time.time_ns()
    old_ids = [new_id(16) for _ in range(3)]
    new_ids = [new_id(16) for _ in range(4)]
    for i, tid in enumerate(old_ids):
        _post(live, "/v1/traces", to_protobuf(request_trace(tid, start_ns=OLD + i * 10**9)).SerializeToString())
    for i, tid in enumerate(new_ids):
        _post(live, "/v1/traces", to_protobuf(request_trace(tid, start_ns=now - i * 10**9)).SerializeToString())
    # a new request whose trace holds a span 8 days old (a clock-skewed host, a
    # long-lived parent): the trace is still alive, so its old span stays with it
    straddling = new_id(16)
    spans = request_trace(straddling, start_ns=now)
    root = spans[-1]
    spans.append(Span(straddling, new_id(8), root.span_id, "skewed", 1, now - 8 * DAY_NS, now, {}, root.resource))
    _post(live, "/v1/traces", to_protobuf(spans).SerializeToString())
    _post(live, "/v1/metrics", _gpu_export(OLD))
    _post(live, "/v1/metrics", _gpu_export(now))
    w = live.collector.writer
    assert w.submit_wait(WriteBatch(engine_steps=[_step(OLD), _step(OLD + 1), _step(now)]))
    # a kept-trace row with no spans stored, decided long ago: dated by its decision
    assert w.submit_wait(WriteBatch(kept=[KeptTrace(new_id(16), "rule", 1.0, OLD, [])]))
    # an engine's start-up and a trace of no known convention, old and new
    assert w.submit_wait(WriteBatch(
        engine_starts=[EngineStart(new_id(16), "llm", "pid 1", t, t + 10**9, {"Load weights": 9.0})
                       for t in (OLD, now)],
        unmatched=[UnmatchedTrace(new_id(16), t, "app", "llm.request", 3) for t in (OLD, now)],
    ))  # fmt: skip
    live.settle()
    # a writer transaction of 8 days ago (the log's newest row, which always stays, is new)
    cursor = live.collector.conn.cursor()
    cursor.execute("INSERT INTO commit_log VALUES (0, ?, NULL)", [OLD])
    cursor.close()

    cutoff = now - 7 * DAY_NS
    before = _counts(live, cutoff)
    for table, (old, new) in before.items():
        assert old > 0 and new > 0, (table, before)  # every table has rows on both sides
    new_trace_ids = [*new_ids, straddling]
    spans_before = dict(live.rows("SELECT trace_id, count(*) FROM spans GROUP BY trace_id"))

    with caplog.at_level(logging.INFO, logger="tokentrace.collector"):
        deleted = retention.run_pass()

    after = _counts(live, cutoff)
    assert after["spans"] == (1, before["spans"][1])  # only the straddling trace's old span stays
    for table in ("requests", "itl_hist", "itl_rollup", "engine_steps", "gpu_samples", "engine_starts",
                  "unmatched_traces", "commit_log"):
        assert after[table] == (0, before[table][1]), (table, before, after)  # old gone, new all here
    # kept_traces go by their trace (old traces are decided now): by trace id below
    assert deleted["requests"] == 3 and deleted["itl_hist"] == 3
    # the old requests' minutes (one rollup row per minute and writer transaction)
    assert 1 <= deleted["itl_rollup"] <= 3
    assert deleted["spans"] == 3 * 6 and deleted["kept_traces"] == 4  # 3 old traces + the orphan row
    assert deleted["engine_steps"] == 2 and deleted["gpu_samples"] == 2
    assert deleted["engine_starts"] == 1 and deleted["unmatched_traces"] == 1
    assert retention.deleted_total == deleted
    # every new request is still there, and every kept trace of them has all its spans
    assert sorted(r[0] for r in live.rows("SELECT trace_id FROM requests")) == sorted(new_trace_ids)
    assert sorted(r[0] for r in live.rows("SELECT trace_id FROM kept_traces")) == sorted(new_trace_ids)
    assert dict(live.rows("SELECT trace_id, count(*) FROM spans GROUP BY trace_id")) == {
        t: spans_before[t] for t in new_trace_ids
    }
    assert spans_before[straddling] == 7
    assert any(
        f"retention: deleted {35 + deleted['itl_rollup']} rows" in r.getMessage() and "requests 3" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    assert retention.run_pass() == {t.table: 0 for t in TABLES}  # idempotent


@pytest.mark.slow
def test_ingestion_during_passes_keeps_every_accepted_request(kept_all: LiveCollector) -> None:
    """Passes run back to back on the retention cursor while exports (old and new,
    every trace kept: spans and their index appended) are ingested: every new
    request accepted is stored, nothing is counted as a write error."""
    live = kept_all
    retention = live.collector.retention
    assert retention is not None
    # old rows for the passes to delete while the writer appends
    for _ in range(20):
        body = to_protobuf([s for _ in range(20) for s in request_trace(start_ns=OLD)]).SerializeToString()
        _post(live, "/v1/traces", body)
    live.settle()
    new_ids: list[str] = []
    done = threading.Event()
    failures: list[BaseException] = []

    def send() -> None:
        try:
            for _ in range(40):
                now = time.time_ns()
                batch_ids = [new_id(16) for _ in range(10)]
                spans = [s for tid in batch_ids for s in request_trace(tid, start_ns=now)]
                spans += [s for _ in range(10) for s in request_trace(start_ns=OLD)]  # old, deleted meanwhile
                _post(live, "/v1/traces", to_protobuf(spans).SerializeToString())
                new_ids.extend(batch_ids)
                live.collector.pipeline.decide_ready(force=True)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)
        finally:
            done.set()

    sender = threading.Thread(target=send)
    sender.start()
    passes = deleted_during = 0
    while not done.is_set():
        deleted_during += sum(retention.run_pass().values())
        passes += 1
    sender.join()
    assert not failures, failures
    live.settle()
    retention.run_pass()  # the last old rows
    assert passes >= 3 and deleted_during > 0, (passes, deleted_during)
    assert retention.failed_passes == 0
    assert live.collector.writer.write_errors == 0
    stored = [r[0] for r in live.rows("SELECT trace_id FROM requests")]
    assert sorted(stored) == sorted(new_ids)  # every accepted request, once; no old one
    assert live.rows("SELECT count(*), count(DISTINCT trace_id) FROM spans") == [(6 * len(new_ids), len(new_ids))]
    assert live.rows("SELECT count(*) FROM kept_traces") == [(len(new_ids),)]


# ---- wiring: a pass at start; nothing deleted unless asked ----------------------------


def _store_old_and_new(db: Path) -> str:
    """Imports one old and one new request into `db` (no retention); gives the new trace id."""
    c = Collector(CollectorSettings(db=db, http_port=0, grpc_port=0, web_port=0, baseline=1.0))
    try:
        new = new_id(16)
        assert c.pipeline.add(request_trace(start_ns=OLD) + request_trace(new, start_ns=time.time_ns()))
        c.pipeline.decide_ready(force=True)
    finally:
        c.close()
    return new


def _requests(db: Path) -> list[str]:
    conn = duckdb.connect(str(db))
    try:
        return sorted(r[0] for r in conn.execute("SELECT trace_id FROM requests").fetchall())
    finally:
        conn.close()


def test_serve_runs_a_pass_at_start(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    new = _store_old_and_new(db)
    assert len(_requests(db)) == 2
    c = Collector(CollectorSettings(db=db, http_port=0, grpc_port=0, web_port=0, retention="30d"))
    try:
        assert c.retention is not None
        c.start()
        deadline = time.monotonic() + 30
        while c.retention.passes < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c.retention.passes >= 1 and c.retention.deleted_total["requests"] == 1
    finally:
        c.close()
    assert _requests(db) == [new]


def test_without_retention_nothing_is_deleted(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    _store_old_and_new(db)
    c = Collector(CollectorSettings(db=db, http_port=0, grpc_port=0, web_port=0))
    try:
        assert c.retention is None
        c.start()
    finally:
        c.close()
    assert len(_requests(db)) == 2


def test_retention_refuses_a_non_positive_duration(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "s.duckdb")
    try:
        with pytest.raises(ValueError, match="positive"):
            Retention(conn, 0)
    finally:
        conn.close()
