"""Attaching the lake and making its tables: the local schema's tables, column for column.

The lake's tables are made from the local schema itself (a scratch in-memory DuckDB migrated
to `SCHEMA_VERSION`), so the analyzer's SQL reads a lake exactly as it reads a file: one
dialect from a laptop to a fleet.  Beside them, `lake_moves` is the movers' ledger: one row
per batch a shard moved, written in the batch's own transaction (`tokentrace.collector.
lake_mover`), so a batch moved twice is recognised and stored once.

Several shards start at once against one new lake: their CREATE TABLEs race, and DuckLake
fails the losers' commits.  Every catalog change here is retried (`retrying`).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from functools import cache, partial
from typing import TypeVar

import duckdb

from tokentrace.store.errors import StoreError
from tokentrace.store.lake.extensions import _quoted, load_lake_extensions
from tokentrace.store.schema import DATA_TABLES, SCHEMA_VERSION, migrate

#: The name the lake is attached under, in every connection that reads or writes it.
ALIAS = "lake"

#: The tables the web looks a trace up in are partitioned by a hash bucket of its id: a look-up
#: of one trace reads 1/16 of the files, which DuckLake prunes by the partition value in the
#: catalog, without opening them (random ids defeat Parquet's min/max statistics).  See
#: docs/scale-out.md.  Not the other tables with a trace id (`itl_hist`, `engine_starts`,
#: `unmatched_traces`), which are read by time or whole: 16 files a move would only cost.
TRACE_BUCKETS = 16
BY_TRACE = ("requests", "spans", "kept_traces")

#: Parquet row groups of the tables the trace page reads by time as well as by id (the steps'
#: shared requests: a 10-minute window of `requests`): DuckDB's default 122,880 rows make a
#: window read ~8x the rows it needs; 16,384-row groups halved the trace page's p95 over a
#: 10 M-request lake (benchmarks/bench_web.py --lake).  Set where the lake is made, so every
#: mover's and compaction's file has them.
ROW_GROUP_ROWS = 16_384
SMALL_ROW_GROUPS = ("requests", "spans", "engine_steps")

#: Tables written as uncompressed Parquet: `requests`, which every report reads whole, column
#: by column, ~100 column scans a report.  Snappy (DuckLake's default) saves little on request
#: summaries as real traffic writes them: 2 M of them with random trace ids and continuous
#: latencies took 224 MB in snappy, 263 MB uncompressed (+17 %); but decompressing costs on
#: every read, most of all of `start_ns` (sorted timestamps, which snappy does shrink), read by
#: nearly every statement: 0.071 -> 0.019 CPU-s a scan of 10 M, the token counts 0.045 ->
#: 0.018, a latency 0.021 -> 0.020.  A full report over 10 M requests: 11.4 -> ~10 CPU-s.
#: Set where the table is made, like the row groups: an operator's own choice
#: (`CALL lake.set_option('parquet_compression', 'zstd', table_name => 'requests')`, say, for
#: object storage billed by the byte) is kept.  docs/scale-out.md.
UNCOMPRESSED = ("requests",)

#: The order of the rows in every file DuckLake writes of a table (a move's, a compaction's, a
#: flush's).  The tables the trace page reads by a time window (a request's engine steps and
#: GPU samples, the requests that shared its steps) by that time: a compaction that merges many
#: moves' files writes their rows interleaved otherwise, every row group spanning hours, and a
#: window read every row group of every file (the shared requests' 10 minutes read all 2 M rows
#: of a 2 M-request lake).  `spans`, read by trace id only, by trace id: a look-up reads the one
#: row group of its bucket's file whose min/max hold the id, not all of them.
SORTED_BY = {
    "requests": "start_ns",
    "engine_steps": "start_ns",
    "gpu_samples": "ts_ns",
    "spans": "trace_id",
}

#: The movers' ledger: `shard` moved the commits `first_seq`..`last_seq` (their `commit_seq`
#: values) of its local file `store_id` (`store_identity`) in one lake transaction with their
#: `rows`.  A position is per (shard, store_id): a shard's new disk starts its own.
MOVES_DDL = (
    "CREATE TABLE IF NOT EXISTS {alias}.lake_moves (shard VARCHAR NOT NULL, first_seq BIGINT"
    " NOT NULL, last_seq BIGINT NOT NULL, rows BIGINT NOT NULL, moved_ns BIGINT NOT NULL,"
    " store_id VARCHAR NOT NULL)"
)

_T = TypeVar("_T")
#: A table's (column, type) list, as `local_columns` gives it.
Columns = tuple[tuple[str, str], ...]

#: Attempts of a catalog change that conflicts with another writer's, and the first backoff.
RETRIES = 8
RETRY_FIRST_S = 0.05


#: What PostgreSQL says when two processes make one new catalog's tables at once (DuckLake's
#: first ATTACH creates them): the loser retries and finds them made.
_CREATE_RACE = (
    "duplicate key value violates unique constraint",
    "already exists",
    # two shards setting the same new lake's options at once (PostgreSQL's serializable check)
    "could not serialize access due to concurrent update",
)


def is_conflict(exc: BaseException) -> bool:
    """Whether `exc` is a DuckLake commit that lost a race with another writer, or a new
    catalog's creation that lost one (retry it)."""
    text = str(exc).lower()
    return (
        isinstance(exc, duckdb.TransactionException)
        or "conflict" in text
        or any(words in text for words in _CREATE_RACE)
    )


def retrying(action: Callable[[], _T], attempts: int = RETRIES) -> _T:
    """Runs `action` (one transaction) again while it conflicts with another writer's, with a
    jittered backoff; the last conflict is raised."""
    delay = RETRY_FIRST_S
    for attempt in range(attempts):
        try:
            return action()
        except duckdb.Error as exc:
            if not is_conflict(exc) or attempt == attempts - 1:
                raise
            time.sleep(delay * (1 + random.random()))  # noqa: S311 - jitter, not secrets
            delay *= 2
    raise AssertionError("unreachable")


def attach(
    conn: duckdb.DuckDBPyConnection,
    uri: str,
    data_path: str | None = None,
    *,
    read_only: bool = False,
) -> None:
    """Attaches the lake `uri` (a DuckLake catalog as DuckDB's ATTACH takes it, e.g.
    `ducklake:postgres:dbname=tokentrace host=db.internal`) to `conn` as `ALIAS`; a writer
    (`read_only=False`) also makes or completes the lake's tables.  Raises StoreError with
    DuckDB's reason when the catalog cannot be reached or read."""
    load_lake_extensions(conn)
    options = []
    if data_path:
        options.append(f"DATA_PATH '{_quoted(data_path)}'")
    if read_only:
        options.append("READ_ONLY")
    clause = f" ({', '.join(options)})" if options else ""
    target = uri if uri.startswith("ducklake:") else f"ducklake:{uri}"

    def attach_once() -> None:
        try:
            conn.execute(f"ATTACH '{_quoted(target)}' AS {ALIAS}{clause}")
        except duckdb.Error:
            conn.execute(f"DETACH DATABASE IF EXISTS {ALIAS}")  # a half-made attachment
            raise

    try:
        retrying(attach_once)
    except duckdb.Error as exc:
        raise StoreError(f"cannot attach the lake {describe(uri)}: {_first_line(exc)}") from exc
    if not read_only:
        try:
            ensure_tables(conn)
        except duckdb.Error as exc:
            raise StoreError(
                f"cannot make the lake's tables in {describe(uri)}: {_first_line(exc)}"
            ) from exc


_PASSWORD = re.compile(r"password\s*=\s*('[^']*'|\S+)", re.IGNORECASE)


def describe(uri: str) -> str:
    """`uri` for a message, with any password masked."""
    return _PASSWORD.sub("password=***", uri)


def _first_line(exc: BaseException) -> str:
    """DuckDB's reason, one line, with any password it repeats from the URI masked."""
    text = str(exc).strip()
    return describe(text.splitlines()[0]) if text else type(exc).__name__


@cache
def local_columns() -> dict[str, tuple[tuple[str, str], ...]]:
    """Gives every data table's (column, type) list as this tokentrace's schema has it."""
    scratch = duckdb.connect()
    try:
        migrate(scratch, "the schema")
        rows = scratch.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE database_name = current_database() AND schema_name = 'main' "
            "ORDER BY table_name, column_index"
        ).fetchall()
    finally:
        scratch.close()
    columns: dict[str, list[tuple[str, str]]] = {}
    for table, column, kind in rows:
        if table in DATA_TABLES:
            columns.setdefault(table, []).append((column, kind))
    return {table: tuple(cols) for table, cols in columns.items()}


def _lake_columns(conn: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    rows = conn.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ?", [ALIAS]
    ).fetchall()
    have: dict[str, set[str]] = {}
    for table, column in rows:
        have.setdefault(table, set()).add(column)
    return have


def ensure_tables(conn: duckdb.DuckDBPyConnection) -> None:
    """Makes the lake's tables where missing, adds columns a newer schema has, and records
    the schema version: each change its own transaction, retried on conflicts."""
    want = local_columns()
    have = _lake_columns(conn)
    for table, cols in want.items():
        if table not in have:
            body = ", ".join(f'"{c}" {kind}' for c, kind in cols)

            def create(table: str = table, body: str = body, cols: Columns = cols) -> None:
                if _has_table(conn, table):  # a retry: another shard made it since, rows and all
                    return
                conn.execute(f"CREATE TABLE IF NOT EXISTS {ALIAS}.{table} ({body})")  # noqa: S608 - names from the schema
                if table in BY_TRACE:
                    conn.execute(
                        f"ALTER TABLE {ALIAS}.{table} SET PARTITIONED BY (bucket({TRACE_BUCKETS}, trace_id))"  # noqa: S608
                    )
                if table in SORTED_BY:
                    conn.execute(
                        f"ALTER TABLE {ALIAS}.{table} SET SORTED BY ({SORTED_BY[table]})"  # noqa: S608
                    )
                _seed_statistics(conn, table, cols[0][0])

            retrying(partial(_in_transaction, conn, create))
            # a table's options, once the table is committed
            if table in SMALL_ROW_GROUPS:
                sql = f"CALL {ALIAS}.set_option('parquet_row_group_size', ?, table_name => ?)"
                retrying(partial(conn.execute, sql, [ROW_GROUP_ROWS, table]))
            if table in UNCOMPRESSED:
                sql = f"CALL {ALIAS}.set_option('parquet_compression', 'uncompressed', table_name => ?)"
                retrying(partial(conn.execute, sql, [table]))
            continue
        for column, kind in cols:
            if column not in have[table]:
                sql = f'ALTER TABLE {ALIAS}.{table} ADD COLUMN IF NOT EXISTS "{column}" {kind}'
                retrying(partial(conn.execute, sql))
    if "lake_moves" not in have:
        retrying(lambda: conn.execute(MOVES_DDL.format(alias=ALIAS)))
    if "schema_version" not in have:
        retrying(
            lambda: conn.execute(
                f"CREATE TABLE IF NOT EXISTS {ALIAS}.schema_version "
                "(version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)"
            )
        )
    [(version,)] = conn.execute(f"SELECT max(version) FROM {ALIAS}.schema_version").fetchall()  # noqa: S608
    if version is None or version < SCHEMA_VERSION:
        retrying(
            lambda: conn.execute(
                f"INSERT INTO {ALIAS}.schema_version VALUES (?, now())",  # noqa: S608
                [SCHEMA_VERSION],
            )
        )
    elif version > SCHEMA_VERSION:
        raise StoreError(
            f"the lake's schema version {version} is newer than this tokentrace "
            f"({SCHEMA_VERSION}); upgrade tokentrace"
        )


def _has_table(conn: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether the lake has `table` as the caller's transaction sees it."""
    found = conn.execute(
        "SELECT 1 FROM duckdb_tables() WHERE database_name = ? AND table_name = ?", [ALIAS, table]
    ).fetchall()
    return bool(found)


def _seed_statistics(conn: duckdb.DuckDBPyConnection, table: str, column: str) -> None:
    """Gives a new lake table its statistics (0 rows) by writing a row and deleting it in the
    transaction that creates it: nothing is stored.

    A table DuckLake has no statistics for (nothing ever written to it) is asked for them again,
    column by column, at every scan: a read of a still-empty table (`gpu_samples` where no GPU
    is sampled, read by every trace page) cost ~27 catalog round trips, one with statistics ~7.
    Real rows written later update them as any write does.  Only in the transaction that
    creates the table (`_has_table`): the delete is of every row."""
    conn.execute(f'INSERT INTO {ALIAS}.{table} ("{column}") VALUES (NULL)')  # noqa: S608 - names from the schema
    conn.execute(f"DELETE FROM {ALIAS}.{table}")  # noqa: S608


def _in_transaction(conn: duckdb.DuckDBPyConnection, action: Callable[[], None]) -> None:
    conn.execute("BEGIN TRANSACTION")
    try:
        action()
        conn.execute("COMMIT")
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise


def open_lake(
    uri: str, data_path: str | None = None, *, read_only: bool = True
) -> duckdb.DuckDBPyConnection:
    """Gives an in-memory DuckDB connection with the lake attached and in use: the analyzer's
    unqualified table names read the lake's tables (a query node, `report --lake`)."""
    conn = duckdb.connect()
    try:
        # a lake's Parquet files never change once written: their footers are read once, not
        # at every statement (a trace page's scans each opened their files' footers again)
        conn.execute("SET parquet_metadata_cache = true")
        attach(conn, uri, data_path, read_only=read_only)
        conn.execute(f"USE {ALIAS}")
    except BaseException:
        conn.close()
        raise
    return conn
