"""The DuckDB schema: every table tokentrace stores, in one place.

This docstring is the one description of the tables; docs/schema.md mirrors it.

Tables
------
schema_version
    One row per applied migration (`version`, `applied_at`).
requests
    One row per request, for **every** request, kept or not (docs/design.md §2, §4).
    Columns are `tokentrace.analyzer.summary.COLUMNS`: times in ms, `start_ns`
    unix ns, `flags` the clamp/reconcile marks, `kept`/`sample_reason`/
    `sample_weight` the sampling decision, `source` the span convention.
itl_hist
    Per request, its inter-token gaps as counts over the fixed log buckets of
    `ITL_BUCKET_BOUNDS_MS` (bucket i counts gaps <= bound i; the last bucket is
    unbounded).  Exact gaps of 100 % of requests at a fixed cost per request,
    so ITL percentiles over all tokens stay cheap on millions of requests.
spans
    The whole span tree of each *kept* trace (attributes, events, links and
    resource as JSON text).
kept_traces
    One row per kept trace: why (`reason`, a named constant of the collector)
    and its sampling `weight` (adjusted count, 1/probability).
engine_steps
    One row per continuous-batching scheduler step (kept whole: they are small),
    from the SDK's step batches or TGI's batch traces.  `request_ids` joins to
    `requests.request_id`: who shared a batch with whom.
gpu_samples
    One row per NVML sample, each with its own timestamp (kept whole).
engine_starts
    One row per engine start-up trace (vLLM's: its spans are kept whole): the
    instance, its start and end, and `phases` (JSON: span name -> ms).
unmatched_traces
    One row per trace that matched no span convention (no request, no start-up,
    no engine step): its root span's name and span count, for the report's coverage.
store_identity
    One row: this file's random `store_id`, its name in a lake's ledger.
itl_rollup
    Per minute of request starts (`minute_ns`, unix ns of the minute), service, model,
    tenant and traffic class, and writer transaction: how many `requests` started then and
    the sum of their `itl_hist` counts.  Written with the rows it sums, so a report's ITL
    histogram reads a few rows a minute instead of every request's 119 counts.  A report
    uses a minute's rows only where their `requests` equal the stored requests of that
    minute (tokentrace.analyzer.itl_window): rows stored before schema 6, or a minute that
    retention has cut, are read from `itl_hist` as before.
commit_log
    One row per writer transaction (`seq`, `committed_ns`, `wal_from`).  Every data
    row carries the `commit_seq` of the transaction that wrote it (NULL: written
    before schema 5): a shard moves rows into the lake by ranges of it.  `wal_from`
    is the first OTLP write-ahead-log record that a restart must replay once this
    transaction is committed (NULL: this commit does not move it; see
    `tokentrace.collector.wal`).
"""

from __future__ import annotations

import os

import duckdb

from tokentrace.store.errors import StoreError

SCHEMA_VERSION = 6

#: The tables of data rows, each stamped with the writer's `commit_seq` (migration 5): what
#: a shard moves into the lake (docs/scale-out.md) and retention deletes.
DATA_TABLES: tuple[str, ...] = (
    "requests", "itl_hist", "spans", "kept_traces", "engine_steps", "gpu_samples",
    "engine_starts", "unmatched_traces", "itl_rollup",
)  # fmt: skip

#: The data tables of schema 5, which migration 5 stamped with `commit_seq` (a table made
#: later is made with the column).
_DATA_TABLES_5 = DATA_TABLES[:8]

#: Seconds of request starts one `itl_rollup` row sums.
ROLLUP_NS = 60 * 10**9
#: The slice an `itl_rollup` row sums: columns of `requests` of the same name (the report's
#: filters other than time).
ROLLUP_SLICE: tuple[str, ...] = ("service", "model", "tenant", "traffic_class")

#: Upper bounds (ms) of the inter-token-gap histogram buckets: log-spaced with
#: ~12 % resolution from 0.1 ms to ~60 s; one more bucket holds anything above.
ITL_BUCKET_BOUNDS_MS: tuple[float, ...] = tuple(round(0.1 * 1.12**i, 6) for i in range(118))

_MIGRATIONS: dict[int, list[str]] = {
    1: [
        """
        CREATE TABLE IF NOT EXISTS requests (
            trace_id VARCHAR NOT NULL,
            request_id VARCHAR NOT NULL,
            start_ns BIGINT NOT NULL,
            e2e_ms DOUBLE NOT NULL,
            queue_ms DOUBLE NOT NULL,
            prefill_ms DOUBLE NOT NULL,
            decode_ms DOUBLE NOT NULL,
            network_ms DOUBLE,
            server_ms DOUBLE NOT NULL,
            queue_wait_ms DOUBLE NOT NULL,
            tokenize_ms DOUBLE NOT NULL,
            other_ms DOUBLE NOT NULL,
            ttft_ms DOUBLE,
            ttft_client_ms DOUBLE,
            tpot_ms DOUBLE,
            itl_p50_ms DOUBLE,
            itl_p95_ms DOUBLE,
            itl_p99_ms DOUBLE,
            itl_max_ms DOUBLE,
            stall_count INTEGER,
            prompt_tokens INTEGER,
            output_tokens INTEGER,
            model VARCHAR NOT NULL,
            tenant VARCHAR NOT NULL,
            traffic_class VARCHAR NOT NULL,
            service VARCHAR NOT NULL,
            instance VARCHAR NOT NULL,
            environment VARCHAR NOT NULL,
            route VARCHAR NOT NULL,
            cold_start BOOLEAN NOT NULL,
            error BOOLEAN NOT NULL,
            gpu_util_mean DOUBLE,
            gpu_mem_max_bytes BIGINT,
            source VARCHAR NOT NULL,
            flags VARCHAR[] NOT NULL,
            kept BOOLEAN NOT NULL,
            sample_reason VARCHAR NOT NULL,
            sample_weight DOUBLE NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS itl_hist (
            trace_id VARCHAR NOT NULL,
            request_id VARCHAR NOT NULL,
            start_ns BIGINT NOT NULL,
            counts INTEGER[] NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS spans (
            trace_id VARCHAR NOT NULL,
            span_id VARCHAR NOT NULL,
            parent_span_id VARCHAR NOT NULL,
            name VARCHAR NOT NULL,
            kind TINYINT NOT NULL,
            start_ns BIGINT NOT NULL,
            end_ns BIGINT NOT NULL,
            status_code TINYINT NOT NULL,
            status_message VARCHAR NOT NULL,
            service_name VARCHAR NOT NULL,
            scope VARCHAR NOT NULL,
            attributes VARCHAR NOT NULL,
            events VARCHAR NOT NULL,
            links VARCHAR NOT NULL,
            resource VARCHAR NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS kept_traces (
            trace_id VARCHAR NOT NULL,
            reason VARCHAR NOT NULL,
            weight DOUBLE NOT NULL,
            decided_ns BIGINT NOT NULL,
            span_count INTEGER NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS engine_steps (
            service VARCHAR NOT NULL,
            instance VARCHAR NOT NULL,
            start_ns BIGINT NOT NULL,
            duration_us BIGINT NOT NULL,
            prefill_tokens INTEGER NOT NULL,
            decode_seqs INTEGER NOT NULL,
            batch_size INTEGER NOT NULL,
            queue_depth INTEGER NOT NULL,
            kv_usage DOUBLE,
            gpu_us BIGINT,
            request_ids VARCHAR[] NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS gpu_samples (
            service VARCHAR NOT NULL,
            instance VARCHAR NOT NULL,
            gpu_index INTEGER NOT NULL,
            ts_ns BIGINT NOT NULL,
            utilization_pct DOUBLE,
            memory_used_bytes BIGINT,
            memory_total_bytes BIGINT,
            sm_clock_mhz DOUBLE,
            power_w DOUBLE
        )
        """,
        # Indexes serve the web's point look-ups (requests_trace: see 2).
        "CREATE INDEX IF NOT EXISTS requests_trace ON requests (trace_id)",
        "CREATE INDEX IF NOT EXISTS spans_trace ON spans (trace_id)",
        "CREATE INDEX IF NOT EXISTS kept_trace ON kept_traces (trace_id)",
    ],
    2: [
        # Every request is a row, so its index is maintained on the collector's
        # hottest insert: it doubled the cost of appending requests (5,000 rows:
        # 24 -> 50 ms) and grew with the table.  The web's one look-up by trace
        # id scans instead: ~12 ms on 1 M requests against ~3 ms with the index.
        # `spans` and `kept_traces` hold kept traces only (a few %): theirs stay.
        "DROP INDEX IF EXISTS requests_trace",
    ],
    3: [
        # The host time of a step's timed forward passes (`instrument_model`): beside
        # `gpu_us`, their gap is the step's launch / sync overhead.  The SDK sent it
        # from the start; the collector dropped it.  NULL for steps stored before.
        "ALTER TABLE engine_steps ADD COLUMN IF NOT EXISTS forward_host_us BIGINT",
    ],
    4: [
        # Where a request's token times came from: `server` (the engine's or the SDK's own),
        # `client` (a client span's chunk events), `none`.  NULL for rows stored before.
        "ALTER TABLE requests ADD COLUMN IF NOT EXISTS token_times_source VARCHAR",
        # OpenTelemetry's `service.instance.id`, kept beside `instance`, which names the
        # process as a person would (vLLM's `vllm.process_id`, host + pid).
        "ALTER TABLE requests ADD COLUMN IF NOT EXISTS instance_id VARCHAR",
        # Unknown is not zero: an engine that does not report a step's batch size, queue
        # depth or token counts (TGI's `infer` steps) stores NULL, which queries skip.
        "ALTER TABLE engine_steps ALTER COLUMN prefill_tokens DROP NOT NULL",
        "ALTER TABLE engine_steps ALTER COLUMN decode_seqs DROP NOT NULL",
        "ALTER TABLE engine_steps ALTER COLUMN batch_size DROP NOT NULL",
        "ALTER TABLE engine_steps ALTER COLUMN queue_depth DROP NOT NULL",
        # An engine's start-up (vLLM's start-up trace: loading weights, allocating the KV
        # cache): the cold-start evidence that precedes an instance's first request.
        """
        CREATE TABLE IF NOT EXISTS engine_starts (
            trace_id VARCHAR NOT NULL,
            service VARCHAR NOT NULL,
            instance VARCHAR NOT NULL,
            start_ns BIGINT NOT NULL,
            end_ns BIGINT NOT NULL,
            phases VARCHAR NOT NULL
        )
        """,
        # Traces that matched no known span convention (no request row): what the report's
        # coverage counts and names by root span, instead of passing over them in silence.
        """
        CREATE TABLE IF NOT EXISTS unmatched_traces (
            trace_id VARCHAR NOT NULL,
            start_ns BIGINT NOT NULL,
            service VARCHAR NOT NULL,
            root_name VARCHAR NOT NULL,
            span_count INTEGER NOT NULL
        )
        """,
    ],
    5: [
        # Which writer transaction wrote each row: the lake's movers take ranges of it, and a
        # range moved twice is recognised by it (docs/scale-out.md).  Appended as a constant
        # per transaction, so the hot insert path pays one column.  NULL for older rows.
        *(f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS commit_seq BIGINT" for t in _DATA_TABLES_5),
        """
        CREATE TABLE IF NOT EXISTS commit_log (
            seq BIGINT NOT NULL,
            committed_ns BIGINT NOT NULL,
            wal_from BIGINT
        )
        """,
        # This file's own name in a lake's ledger: a shard's position there is kept per
        # (shard name, store), so a shard whose disk was replaced, or two processes given one
        # --shard by mistake, move their rows from their own first commit, never skipping
        # commits another file's seqs already passed.
        "CREATE TABLE IF NOT EXISTS store_identity (store_id VARCHAR NOT NULL)",
        "INSERT INTO store_identity SELECT uuid()::VARCHAR"
        " WHERE NOT EXISTS (SELECT 1 FROM store_identity)",
    ],
    6: [
        # The ITL histogram per minute and slice, summed as it is written: a report over
        # 10 M requests reads ~1 row per writer commit and slice, not 10 M lists of 119
        # counts (1.5 s).  Rows of older files are not summed here: the report reads their
        # minutes from itl_hist (see the table's description above).
        """
        CREATE TABLE IF NOT EXISTS itl_rollup (
            minute_ns BIGINT NOT NULL,
            service VARCHAR NOT NULL,
            model VARCHAR NOT NULL,
            tenant VARCHAR NOT NULL,
            traffic_class VARCHAR NOT NULL,
            requests BIGINT NOT NULL,
            counts BIGINT[] NOT NULL,
            commit_seq BIGINT
        )
        """,
    ],
}


#: Made, where missing, in each migration's transaction (a new file has none yet).
_SCHEMA_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version "
    "(version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)"
)


def current_version(conn: duckdb.DuckDBPyConnection) -> int:
    """Gives the highest applied schema version, 0 for an empty database (or one
    without tokentrace's tables).  Reads only: works on a read-only connection."""
    if not conn.execute(
        "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = 'schema_version'"
    ).fetchall():
        return 0
    # fetchall: a result left unread would keep the connection busy for its next user
    [(version,)] = conn.execute("SELECT max(version) FROM schema_version").fetchall()
    return int(version) if version is not None else 0


def check_version(conn: duckdb.DuckDBPyConnection, db: str | os.PathLike[str] | None = None) -> int:
    """Gives the schema version of the database `db` (`conn`'s; None: the path `conn`
    opened); raises StoreError when a newer tokentrace wrote it: its tables are not
    what this one reads and writes.  The one check for `open_db` (before migrating)
    and `open_read_only` (reports)."""
    version = current_version(conn)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{_named(conn, db)}: database schema version {version} is newer than this "
            f"tokentrace ({SCHEMA_VERSION}); upgrade tokentrace"
        )
    return version


def _named(conn: duckdb.DuckDBPyConnection, db: str | os.PathLike[str] | None) -> str:
    """Gives the database's name for a message: `db` as given, else the file `conn` opened."""
    if db is not None:
        return str(db)
    [(path,)] = conn.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchall()
    return str(path)


def migrate(conn: duckdb.DuckDBPyConnection, db: str | os.PathLike[str] | None = None) -> int:
    """Applies every pending migration in one transaction each; gives the version.

    Raises StoreError `cannot migrate <db> from schema N to M: <DuckDB's reason>` when
    one fails (a COMMIT that cannot write the log: a full disk, a directory that
    takes no new file); the migrations before it stay applied.  `db` names the
    database in messages (None: the path `conn` opened)."""
    version = check_version(conn, db)
    if version == SCHEMA_VERSION:
        return version
    for target in range(version + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN TRANSACTION")
        try:
            for statement in (_SCHEMA_VERSION_TABLE, *_MIGRATIONS[target]):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?, now())", [target])
            conn.execute("COMMIT")
        except BaseException as exc:
            _roll_back(conn)
            if not isinstance(exc, duckdb.Error):
                raise
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            done = f" (it is at schema {target - 1} now)" if target - 1 > version else ""
            raise StoreError(
                f"cannot migrate {_named(conn, db)} from schema {version} to {SCHEMA_VERSION}: "
                f"{reason}{done}"
            ) from exc
    return SCHEMA_VERSION


def _roll_back(conn: duckdb.DuckDBPyConnection) -> None:
    """Ends a failed migration's transaction.  A COMMIT that failed has ended it
    already, and its ROLLBACK's own error ("no transaction is active") would
    replace the error that says what went wrong: it is left unsaid."""
    try:
        conn.execute("ROLLBACK")
    except duckdb.Error:
        pass
