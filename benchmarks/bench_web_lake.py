"""bench_web's lake mode: a DuckLake of many requests, written as shards write it, and its traces.

The lake's catalog is a real PostgreSQL this benchmark starts (tests/tt_postgres.py), its data
Parquet files on local disk.  It is filled the way shards fill it: each of `shards` shards
moves its own requests (split by trace id, as the OpenTelemetry Collector's loadbalancing
exporter splits them) in many small transactions of `move_rows` requests with their ITL
histograms, kept spans and engine steps, then a shard's compaction
(`ducklake_merge_adjacent_files`) runs.  One giant insert would flatter the layout: it
writes each partition as one big, well-sorted file.

Then every statement the web's trace views run (the page, its JSON twin, the exports, the
jump box's prefix) is run under EXPLAIN ANALYZE over the lake, and the Parquet files each
one read are printed beside the table's files: the look-ups by trace id must read one
`bucket(TRACE_BUCKETS, trace_id)` partition's files, not all.  Last, random trace ids are
opened through the web app over the lake (a query node's `StoreReader`).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
from bench_web import served, time_traces, write_batch

from tokentrace.collector.lake_upkeep import set_inlining
from tokentrace.collector.settings import CollectorSettings
from tokentrace.store.lake import catalog
from tokentrace.store.reader import LakeAddress, StoreReader
from tokentrace.web import _trace
from tokentrace.web.app import _steps_of_trace, create_web_app

TESTS = Path(__file__).resolve().parents[1] / "tests"

#: The tables `--sorted` sorts by trace id within each file (DuckLake's SET SORTED BY).
SORTED_TABLES = ("requests", "spans", "kept_traces")

#: The lake's tables a trace page reads, whose files are counted.
TABLES = ("requests", "spans", "kept_traces", "engine_steps", "gpu_samples", "itl_hist")


def start_postgres() -> Any:
    """Starts the tests' PostgreSQL (Debian's server, on a free loopback port, in a directory
    of its own that its `stop` deletes)."""
    sys.path.insert(0, str(TESTS))  # tt_postgres and its tt_testkit live with the tests
    from tt_postgres import PostgresServer  # noqa: PLC0415 - from the tests folder, by path

    return PostgresServer()


def move_shard(
    uri: str, data: str, *, n: int, shard: int, shards: int, move_rows: int
) -> list[float]:
    """Moves shard `shard`'s requests (by a hash of the row, as of a trace id) into the lake, `move_rows` at
    a time, one lake transaction each with its ledger row, retried on conflicts as the mover
    does; gives each move's time in ms."""
    conn = duckdb.connect()
    catalog.attach(conn, uri, data)
    window = move_rows * shards
    times: list[float] = []
    try:
        for k, lo in enumerate(range(0, n, window)):
            seq = k * shards + shard + 1

            def move(lo: int = lo, seq: int = seq) -> None:
                conn.execute("BEGIN TRANSACTION")
                try:
                    write_batch(
                        conn,
                        "lake.",
                        lo=lo,
                        hi=min(n, lo + window),
                        n=n,
                        seq=seq,
                        shard=shard,
                        shards=shards,
                    )
                    conn.execute(
                        "INSERT INTO lake.lake_moves BY NAME SELECT ? AS shard, ? AS first_seq, ? AS last_seq,"
                        " count(*) AS rows, ? AS moved_ns, ? AS store_id FROM batch",
                        [f"shard-{shard}", seq, seq, time.time_ns(), f"bench-{shard}"],
                    )
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise

            t = time.perf_counter()
            catalog.retrying(move)
            times.append((time.perf_counter() - t) * 1000)
            if shard == 0 and k % max(1, n // window // 10) == 0:
                print(f"  shard 0 moved {min(n, lo + window):>11,} requests' worth", flush=True)
    finally:
        conn.close()
    return times


def build_lake(
    uri: str,
    data: str,
    *,
    n: int,
    shards: int,
    move_rows: int,
    sorted_ids: bool,
    row_group_rows: int = 0,
) -> None:
    """Fills the lake with `n` requests, moved by `shards` shards at once (a thread each, a
    connection each), then runs a shard's upkeep: flush the inlined rows, merge small files.
    `row_group_rows`: Parquet row groups of `catalog.SMALL_ROW_GROUPS` (0: the lake's own,
    `catalog.ROW_GROUP_ROWS`)."""
    conn = duckdb.connect()
    try:
        catalog.attach(conn, uri, data)  # makes the tables, as the first shard's start does
        set_inlining(conn)
        if row_group_rows:
            for table in catalog.SMALL_ROW_GROUPS:
                conn.execute(
                    "CALL lake.set_option('parquet_row_group_size', ?, table_name => ?)",
                    [row_group_rows, table],
                )
        if sorted_ids:
            for table in SORTED_TABLES:
                conn.execute(f"ALTER TABLE lake.{table} SET SORTED BY (trace_id)")  # noqa: S608
        started = time.perf_counter()
        with ThreadPoolExecutor(shards) as pool:
            runs = [
                pool.submit(move_shard, uri, data, n=n, shard=k, shards=shards, move_rows=move_rows)
                for k in range(shards)
            ]
            moves = [ms for run in runs for ms in run.result()]
        print(
            f"lake: {len(moves):,} moves of ~{move_rows:,} requests by {shards} shards at once in "
            f"{time.perf_counter() - started:.1f} s (a move: p50 {statistics.median(moves):.0f} ms)"
        )
        print(f"  files before upkeep: {live_files(conn)}")
        for step in ("ducklake_flush_inlined_data", "ducklake_merge_adjacent_files"):
            t = time.perf_counter()
            conn.execute(f"CALL {step}('lake')").fetchall()
            print(f"  {step}: {time.perf_counter() - t:.1f} s")
        print(f"  files after: {live_files(conn)}")
    finally:
        conn.close()


def live_files(conn: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Gives the Parquet files of each table in the lake's newest snapshot (from its catalog)."""
    rows = conn.execute(
        "SELECT t.table_name, count(*) FROM __ducklake_metadata_lake.ducklake_data_file f "
        "JOIN __ducklake_metadata_lake.ducklake_table t USING (table_id) "
        "WHERE f.end_snapshot IS NULL AND t.end_snapshot IS NULL GROUP BY ALL ORDER BY 1"
    ).fetchall()
    return {str(table): int(count) for table, count in rows if table in TABLES}


def check_pruning(conn: duckdb.DuckDBPyConnection, trace_id: str) -> None:
    """Prints the files each statement of the web's trace views reads, against the table's."""
    sys.path.insert(0, str(TESTS))  # the statement recorder lives with the tests
    from statement_recorder import StatementRecorder, files_read  # noqa: PLC0415 - by path

    views: dict[str, Callable[[Any], Any]] = {
        "trace page (and /api/trace)": lambda cur: _trace.trace_data(cur, trace_id),
        "export otlp.json": lambda cur: _trace.kept_spans(cur, trace_id),
        "export chrome.json": lambda cur: _steps_of_trace(cur, trace_id),
        "jump box (16-digit prefix)": lambda cur: _trace.resolve_trace_prefix(cur, trace_id[:16]),
    }
    total = live_files(conn)
    print(f"files read per statement (trace {trace_id}; files in the lake: {total}):")
    for view, run in views.items():
        rec = StatementRecorder(conn.cursor())
        rec.execute("USE lake")
        run(rec)
        for sql, params in rec.statements[1:]:
            if not _reads_rows(sql):
                continue  # a cursor's BEGIN, USE, COMMIT (web/_reads.py)
            t = time.perf_counter()
            conn.execute(sql, params).fetchall()
            ms = (time.perf_counter() - t) * 1000
            read = files_read(conn, sql, params)
            said = ", ".join(
                f"{table} {files}/{total.get(table, 0)}" for table, files in read.items()
            )
            first = " ".join(line for line in sql.splitlines() if not line.startswith("--"))[:60]
            print(f"  {view:28} {ms:7.1f} ms  {said:34} {first}")


def _reads_rows(sql: str) -> bool:
    """Whether `sql` reads a table (the page's statements), not a cursor's set-up."""
    words = " ".join(line for line in sql.splitlines() if not line.startswith("--")).split()
    return bool(words) and words[0].upper() in ("SELECT", "WITH") and "current_database" not in sql


def lake_traces(
    tmp: Path,
    *,
    n: int,
    shards: int,
    move_rows: int,
    sorted_ids: bool,
    row_group_rows: int,
    traces: dict[str, list[str]],
    local_db: Path,
) -> dict[str, list[float]]:
    """Builds the lake under `tmp`, prints its files and what each trace statement reads, and
    gives the server times of opening `traces` through the web app over it."""
    postgres = start_postgres()
    try:
        uri, data = postgres.new_lake(tmp / "lake-data")
        build_lake(
            uri,
            data,
            n=n,
            shards=shards,
            move_rows=move_rows,
            sorted_ids=sorted_ids,
            row_group_rows=row_group_rows,
        )
        reader = catalog.open_lake(uri, data, read_only=True)
        try:
            check_pruning(reader, next(iter(traces.values()))[0])
        finally:
            reader.close()
        store = StoreReader(lake=LakeAddress(uri, data))
        with served(create_web_app(CollectorSettings(db=local_db), store=store)) as client:
            return time_traces(client, traces)
    finally:
        postgres.stop()
