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

from tokentrace.store.lake import catalog
from tokentrace.store.lake.catalog import (
    ALIAS,
    BY_TRACE,
    ROW_GROUP_ROWS,
    SMALL_ROW_GROUPS,
    SORTED_BY,
    TRACE_BUCKETS,
    UNCOMPRESSED,
    attach,
)
from tokentrace.store.reader import LakeAddress, StoreReader
from tokentrace.web import _trace
from tokentrace.web._reads import WIDTH
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
        uncompressed = conn.execute(
            "SELECT scope_entry, value FROM ducklake_options(?)"
            " WHERE option_name = 'parquet_compression' ORDER BY 1",
            [ALIAS],
        ).fetchall()
        # what the moves wrote: each table's Parquet files, and their columns' codecs
        codecs: dict[str, list[str]] = {}
        for table in ("requests", "spans"):
            files = [
                f
                for (f,) in conn.execute(
                    "SELECT data_file FROM ducklake_list_files(?, ?)", [ALIAS, table]
                ).fetchall()
            ]
            assert files, table
            codecs[table] = [
                c
                for (c,) in conn.execute(
                    "SELECT DISTINCT compression FROM parquet_metadata(?) ORDER BY 1", [files]
                ).fetchall()
            ]
        sorted_by = conn.execute(
            f"SELECT t.table_name, e.expression FROM {meta}.ducklake_sort_expression e"  # noqa: S608
            f" JOIN {meta}.ducklake_sort_info i USING (sort_id, table_id)"
            f" JOIN {meta}.ducklake_table t USING (table_id)"
            " WHERE i.end_snapshot IS NULL AND t.end_snapshot IS NULL ORDER BY 1"
        ).fetchall()
    finally:
        conn.close()
    assert [t for (t,) in partitioned] == sorted(BY_TRACE) == ["kept_traces", "requests", "spans"]
    assert row_groups == [(f"main.{t}", str(ROW_GROUP_ROWS)) for t in sorted(SMALL_ROW_GROUPS)]
    assert "engine_steps" in SMALL_ROW_GROUPS
    # `requests`, read whole by every report, uncompressed; the rest in DuckLake's snappy
    assert (
        uncompressed
        == [(f"main.{t}", "uncompressed") for t in UNCOMPRESSED]
        == [("main.requests", "uncompressed")]
    )
    assert codecs == {"requests": ["UNCOMPRESSED"], "spans": ["SNAPPY"]}
    # the tables read by a time window sorted by that time in every file written, spans by id
    assert (
        [(t, e.strip('"')) for t, e in sorted_by]
        == sorted(SORTED_BY.items())
        == [
            ("engine_steps", "start_ns"),
            ("gpu_samples", "ts_ns"),
            ("requests", "start_ns"),
            ("spans", "trace_id"),
        ]
    )


#: The rows `_write_interleaved_moves` writes: requests, and engine steps (a step every 10 ms).
REQUESTS = 20_000
STEPS = 40_000
STEP_NS = 10_000_000

#: One move's requests and steps: every `moves`-th row from `k`, so each move spans all of the
#: time, as the moves of several shards (and of several engines' steps) do.
INTERLEAVED_SQL = (
    MOVE_SQL[0].replace("range($lo, $hi)", "range($k, $requests, $moves)"),
    """INSERT INTO lake.engine_steps BY NAME SELECT 'llm' AS service, 'pod-0' AS instance,
       $t0 + s * $step_ns AS start_ns, 900 AS duration_us, ['req-' || s] AS request_ids,
       $seq AS commit_seq FROM range($k, $steps, $moves) t(s)""",
)


def _write_interleaved_moves(uri: str, data: str, moves: int) -> None:
    """Writes REQUESTS requests and STEPS engine steps in `moves` moves of interleaved times,
    then compacts the lake as a shard's upkeep does (`ducklake_merge_adjacent_files`)."""
    conn = duckdb.connect()
    try:
        attach(conn, uri, data)
        conn.execute(f"CALL {ALIAS}.set_option('data_inlining_row_limit', 0)")
        values = {"$t0": T0, "$step_ns": STEP_NS, "$requests": REQUESTS, "$steps": STEPS}
        for k in range(moves):
            for sql in INTERLEAVED_SQL:
                for name, value in {**values, "$k": k, "$moves": moves, "$seq": k + 1}.items():
                    sql = sql.replace(name, str(value))
                conn.execute(sql)
        conn.execute(f"CALL ducklake_merge_adjacent_files('{ALIAS}')").fetchall()
    finally:
        conn.close()


def test_a_compacted_lake_keeps_the_tables_read_by_time_in_time_order(
    lake: tuple[str, str],
) -> None:
    """Moves that each span all of the time, merged: every file of `requests` (one per trace-id
    bucket) and of `engine_steps` holds its rows in start_ns order, so a time window (a
    request's engine steps, the requests that shared them) reads the row groups around it.
    Merged unsorted, a 2 M-request lake's row groups each spanned hours: the shared requests'
    10-minute window read every row group of every file."""
    uri, data = lake
    _write_interleaved_moves(uri, data, moves=4)
    conn = duckdb.connect()
    try:
        attach(conn, uri, data, read_only=True)
        files = {
            table: [
                f
                for (f,) in conn.execute(
                    "SELECT data_file FROM ducklake_list_files(?, ?)", [ALIAS, table]
                ).fetchall()
            ]
            for table in ("requests", "engine_steps")
        }
        out_of_order = {
            f: conn.execute(
                "SELECT count(*) FROM (SELECT start_ns < lag(start_ns) OVER (ORDER BY file_row_number)"
                " AS back FROM read_parquet(?, file_row_number = true)) WHERE back",
                [f],
            ).fetchone()
            for fs in files.values()
            for f in fs
        }
        [step_file] = files["engine_steps"]
        row_groups = conn.execute(
            "SELECT DISTINCT row_group_id, row_group_num_rows FROM parquet_metadata(?) ORDER BY 1",
            [step_file],
        ).fetchall()
    finally:
        conn.close()
    assert len(files["requests"]) == TRACE_BUCKETS  # merged: one file per bucket
    assert all(n == (0,) for n in out_of_order.values()), out_of_order
    assert [rows for _, rows in row_groups] == [
        ROW_GROUP_ROWS,
        ROW_GROUP_ROWS,
        STEPS - 2 * ROW_GROUP_ROWS,
    ]


def _catalog_queries(err: str) -> list[str]:
    """The statements DuckLake sent its PostgreSQL catalog (`pg_debug_show_queries` prints
    each, a blank line after it), one per round trip."""
    return [
        q.strip() for q in err.split("\n\n") if q.strip().startswith(("BEGIN", "COPY", "COMMIT"))
    ]


def test_a_trace_page_asks_the_catalog_in_few_round_trips(
    lake: tuple[str, str], capfd: pytest.CaptureFixture[str]
) -> None:
    """Each statement over the lake costs its round trips to the catalog before it reads a
    byte: a transaction of its own (begin, the newest snapshot, commit), then its table's files
    and statistics.  The trace page runs its statements in one transaction per cursor, and a
    still-empty table (`gpu_samples` here) has statistics from its creation, so DuckLake does not
    ask for them again for each column at each scan."""
    uri, data = lake
    _write_moves(uri, data)
    trace_id = "c4ca4238a0b923820dcc509a6f75849b"
    reader = StoreReader(lake=LakeAddress(uri, data))
    try:
        with reader.cursor() as cur:
            _trace.trace_data(cur, trace_id)  # the first page: plans, the Parquet footers
            cur.execute("SET GLOBAL pg_debug_show_queries = true")
        capfd.readouterr()
        with reader.cursor() as cur:
            data_of_page = _trace.trace_data(cur, trace_id)
            cur.execute("SET GLOBAL pg_debug_show_queries = false")
        asked = _catalog_queries(capfd.readouterr().err)
    finally:
        reader.close()
    assert data_of_page["requests"][0]["engine_steps"]["served"] == 1
    transactions = [q for q in asked if q.startswith("BEGIN")]
    table_stats = [q for q in asked if "ducklake_table_stats" in q]
    # the reader's `USE lake`, then one per cursor of the page (7 when each statement had its own)
    assert len(transactions) <= 1 + WIDTH, asked
    # none asked again (20 when the empty gpu_samples had no statistics: 86 round trips in all)
    assert len(table_stats) <= 2, table_stats
    assert len(asked) <= 50, asked


def test_a_table_made_by_another_shard_meanwhile_keeps_its_rows(
    lake: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard whose creation of the lake's tables lost a race retries it and finds them made,
    maybe with rows another shard has moved since: its retry leaves them as they are (a new
    table's statistics are seeded by a row written and deleted, which on a made table would
    have deleted every row)."""
    uri, data = lake
    _write_moves(uri, data)
    conn = duckdb.connect()
    try:
        attach(conn, uri, data)
        before = {t: _count(conn, t) for t in ("requests", "spans", "engine_steps")}
        # the tables as this shard saw them before the other shard's commit: none yet
        monkeypatch.setattr(catalog, "_lake_columns", lambda conn: {})
        catalog.ensure_tables(conn)
        after = {t: _count(conn, t) for t in ("requests", "spans", "engine_steps")}
    finally:
        conn.close()
    assert before == after == {"requests": 800, "spans": 1600, "engine_steps": 800}


def _count(conn: duckdb.DuckDBPyConnection, table: str) -> int:
    [(rows,)] = conn.execute(f"SELECT count(*) FROM {ALIAS}.{table}").fetchall()  # noqa: S608
    return int(rows)
