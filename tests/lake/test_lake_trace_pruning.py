"""Opening one trace over the lake reads one trace-id bucket's files, not all of them.

Random trace ids defeat Parquet's min/max statistics, so the lake partitions every table the
web looks a trace up in by `bucket(TRACE_BUCKETS, trace_id)`, and DuckLake skips the other
buckets' files from its catalog, without opening them.  Every statement the trace views run
(the page and its JSON, the OTLP and Chrome exports) is run here under EXPLAIN ANALYZE over a
real lake (PostgreSQL catalog, Parquet files) written in several moves, and the files each
look-up by trace id read are counted: one move's file of the trace's bucket per move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb
import pytest
from statement_recorder import StatementRecorder, files_read

from tokentrace.store.lake.catalog import (
    ALIAS,
    BY_TRACE,
    ROW_GROUP_ROWS,
    SMALL_ROW_GROUPS,
    TRACE_BUCKETS,
    attach,
)
from tokentrace.store.reader import LakeAddress, StoreReader
from tokentrace.web import _trace
from tokentrace.web.app import _steps_of_trace

pytestmark = pytest.mark.slow

MOVES = 4
TRACES_PER_MOVE = 200  # enough that every move writes a file in every bucket
T0 = 1_767_225_600 * 10**9

#: One move of a shard: its requests, their spans (request span, decode span), kept traces and
#: the engine steps that served them.  Row i's trace id is md5(i): random, as real ids are.
MOVE_SQL = (
    """INSERT INTO lake.requests BY NAME SELECT md5(i::VARCHAR) AS trace_id, 'req-' || i AS request_id,
       $t0 + i * 10000000 AS start_ns, 500.0 AS e2e_ms, 10.0 AS queue_ms, 90.0 AS prefill_ms,
       400.0 AS decode_ms, 500.0 AS server_ms, 10.0 AS queue_wait_ms, 0.0 AS tokenize_ms,
       0.0 AS other_ms, 'm' AS model, '' AS tenant, 'interactive' AS traffic_class, 'llm' AS service,
       'pod-0' AS instance, '' AS environment, '' AS route, false AS cold_start, false AS error,
       'tokentrace' AS source, []::VARCHAR[] AS flags, true AS kept, 'baseline' AS sample_reason,
       1.0 AS sample_weight, $seq AS commit_seq FROM range($lo, $hi) t(i)""",
    """INSERT INTO lake.spans BY NAME SELECT md5(i::VARCHAR) AS trace_id, s.span_id, s.parent_span_id,
       s.name, s.kind, $t0 + i * 10000000 AS start_ns, $t0 + i * 10000000 + 500000000 AS end_ns,
       0 AS status_code, '' AS status_message, 'llm' AS service_name, '' AS scope,
       '{"tokentrace.request.id": "req-' || i || '"}' AS attributes, '[]' AS events, '[]' AS links,
       '{}' AS resource, $seq AS commit_seq
       FROM range($lo, $hi) t(i), (VALUES ('a1', '', 'tokentrace.request', 2),
                                         ('a2', 'a1', 'tokentrace.decode', 1))
                                  s(span_id, parent_span_id, name, kind)""",
    """INSERT INTO lake.kept_traces BY NAME SELECT md5(i::VARCHAR) AS trace_id, 'baseline' AS reason,
       1.0 AS weight, $t0 + i * 10000000 AS decided_ns, 2 AS span_count, $seq AS commit_seq
       FROM range($lo, $hi) t(i)""",
    """INSERT INTO lake.engine_steps BY NAME SELECT 'llm' AS service, 'pod-0' AS instance,
       $t0 + i * 10000000 + 100000000 AS start_ns, 20000 AS duration_us, ['req-' || i] AS request_ids,
       $seq AS commit_seq FROM range($lo, $hi) t(i)""",
)


def _write_moves(uri: str, data: str) -> None:
    conn = duckdb.connect()
    try:
        attach(conn, uri, data)
        # no inlining: these small moves stand for big ones, which write files
        conn.execute(f"CALL {ALIAS}.set_option('data_inlining_row_limit', 0)")
        for seq in range(MOVES):
            lo, hi = seq * TRACES_PER_MOVE, (seq + 1) * TRACES_PER_MOVE
            conn.execute("BEGIN TRANSACTION")
            for sql in MOVE_SQL:
                for name, value in (("$t0", T0), ("$seq", seq + 1), ("$lo", lo), ("$hi", hi)):
                    sql = sql.replace(name, str(value))
                conn.execute(sql)
            conn.execute("COMMIT")
    finally:
        conn.close()


def test_every_trace_look_up_of_the_web_reads_one_buckets_files(lake: tuple[str, str]) -> None:
    uri, data = lake
    _write_moves(uri, data)
    trace_id = "c4ca4238a0b923820dcc509a6f75849b"  # md5('1'): the second request of the first move
    views: dict[str, Callable[[Any], Any]] = {
        "trace page": lambda cur: _trace.trace_data(cur, trace_id),
        "otlp export": lambda cur: _trace.kept_spans(cur, trace_id),
        "chrome export": lambda cur: _steps_of_trace(cur, trace_id),
    }
    reader = StoreReader(lake=LakeAddress(uri, data))
    looked_up: set[str] = set()
    try:
        for view, run in views.items():
            with reader.cursor() as cur:
                recorder = StatementRecorder(cur)
                assert run(recorder), view
                for sql, params in recorder.statements:
                    if trace_id not in params:
                        continue  # the engine steps and GPU samples around it: by time
                    read = files_read(cur, sql, params)
                    for table in ("requests", "spans", "kept_traces"):
                        if table in read:
                            looked_up.add(table)
                            # one file of the trace's bucket from each move, of MOVES * buckets
                            assert read[table] == MOVES, f"{view}: {table} read {read} files: {sql}"
            with reader.cursor() as cur:
                [(files,)] = cur.execute(
                    "SELECT count(*) FROM ducklake_list_files(?, 'requests')", [ALIAS]
                ).fetchall()
                assert files == MOVES * TRACE_BUCKETS
    finally:
        reader.close()
    assert looked_up == {"requests", "spans", "kept_traces"}


def test_the_lake_is_laid_out_for_trace_pages(lake: tuple[str, str]) -> None:
    """What a new lake is made with: the trace-id buckets on the tables looked up by trace id
    only (`itl_hist` is read whole: buckets would only split its moves into 16 files), and
    16,384-row Parquet row groups on `requests` and `spans`, which the trace page also reads
    by time (a time window reads its row groups, not DuckDB's default 122,880 rows each)."""
    uri, data = lake
    _write_moves(uri, data)
    conn = duckdb.connect()
    try:
        attach(conn, uri, data, read_only=True)
        meta = f"__ducklake_metadata_{ALIAS}"  # DuckLake's catalog, attached beside the lake
        partitioned = conn.execute(
            f"SELECT t.table_name FROM {meta}.ducklake_partition_info p JOIN {meta}.ducklake_table t"  # noqa: S608
            " USING (table_id) WHERE p.end_snapshot IS NULL AND t.end_snapshot IS NULL ORDER BY 1"
        ).fetchall()
        row_groups = conn.execute(
            "SELECT scope_entry, value FROM ducklake_options(?)"
            " WHERE option_name = 'parquet_row_group_size' ORDER BY 1",
            [ALIAS],
        ).fetchall()
    finally:
        conn.close()
    assert [t for (t,) in partitioned] == sorted(BY_TRACE) == ["kept_traces", "requests", "spans"]
    assert row_groups == [(f"main.{t}", str(ROW_GROUP_ROWS)) for t in sorted(SMALL_ROW_GROUPS)]
