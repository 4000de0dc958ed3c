"""Data retention (`serve --retention 7d`): deletes rows older than now − retention.

A background thread runs one pass at start and then every few minutes.  Each
pass deletes, one transaction per table, the rows whose time column is before
the cutoff; `kept_traces` and `spans` (the rows of kept traces) share one
transaction, so both see the same traces.  Values go in as bound parameters only;
table and column names come from `TABLES` below, which is checked against the
database's own columns when the collector starts.

Why a thread of its own, on its own cursor, and not the writer thread: DuckDB
runs transactions of one process with MVCC and optimistic concurrency control:
"appends will never conflict, even on the same table"; only two transactions
that update or delete the *same row* conflict (duckdb.org, Concurrency).  The
writer only appends and the web only reads, so this thread is the only one
that ever deletes: its DELETEs cannot conflict with anything, and the writer's
appends, batched behind a queue, are never blocked by a pass nor failed by one
(tests/collector/test_retention.py runs passes back to back while exports are
ingested and checks every accepted request is stored).  Passes are serialized
by a lock, so a pass requested by hand (`run_pass`) never races the thread's.

In a shard of a lake (`serve --lake`) the retention is the hot window (`--lake-hot-window`):
a row is deleted once it is older than that AND its commit is in the lake (`moved_through`,
the mover's last read of the lake's ledger), never before it is moved; the shard's own
explorer keeps showing the last hour.  A trace's spans moved in different commits (a late
span) are deleted as each is moved, so the local file may show a part of such a trace for
a moment; the lake has it whole.

The rows of one trace go together: a trace's `spans` and its `kept_traces` row
are deleted once *none* of its spans started at or after the cutoff, so a kept
trace whose request is still retained keeps its whole span tree (a request's
`start_ns` is the start of one of its trace's spans).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

logger = logging.getLogger("tokentrace.collector")

#: Seconds a pass waits for the next one, at most (a shorter retention: a quarter of it).
PASS_INTERVAL_S = 300.0

_UNIT_S = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def parse_duration(text: str) -> float:
    """Gives the seconds of a duration such as `7d`, `36h`, `90m`, `45s` or `1d12h`.

    A unit is required: a bare number (`7`: seven seconds or seven days?) is
    refused, as are zero and anything that is not such a duration."""
    raw = text.strip().lower().replace(" ", "")
    example = "e.g. 7d, 36h, 90m, 3600s or 1d12h"
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        raise ValueError(
            f"retention {text!r} has no unit ({example}): a bare number could be seconds or days"
        )
    if not raw or _PART.sub("", raw) != "":
        raise ValueError(f"retention {text!r} is not a duration ({example})")
    seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _PART.findall(raw))
    if not seconds > 0:
        raise ValueError(f"retention must be positive, got {text!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class Retained:
    """One table and the column that says when its row happened (unix ns)."""

    table: str
    column: str
    #: a trace's rows: deleted only when the trace has no span at/after the cutoff
    by_trace: bool = False


#: Every table with data, in deletion order: `kept_traces` before `spans`, whose
#: rows tell which traces are old (deleting spans first would leave the kept
#: row of a trace imported late, `decided_ns` recent, with nothing to date it).
#: `schema_version` holds no data and is never touched.
TABLES: tuple[Retained, ...] = (
    Retained("requests", "start_ns"),
    Retained("itl_hist", "start_ns"),
    # a minute retention cuts in two is read from itl_hist by reports until it is gone
    Retained("itl_rollup", "minute_ns"),
    Retained("kept_traces", "decided_ns", by_trace=True),
    Retained("spans", "start_ns", by_trace=True),
    Retained("engine_steps", "start_ns"),
    Retained("gpu_samples", "ts_ns"),
    Retained("engine_starts", "start_ns"),
    Retained("unmatched_traces", "start_ns"),
    # the newest row stays: it holds the writer's last `commit_seq` and the WAL checkpoint
    Retained("commit_log", "committed_ns"),
)

#: One transaction each: a table, or the tables of a trace together.  `kept_traces`
#: and `spans` must see one snapshot: a trace the writer commits between two
#: transactions would otherwise lose its spans and keep its kept row.
_GROUPS: tuple[tuple[Retained, ...], ...] = tuple(
    tuple(t for t in TABLES if t.by_trace) if t.table == "kept_traces" else (t,)
    for t in TABLES
    if t.table != "spans"
)

# The traces with a span before the cutoff, and those of them still alive (a span
# at/after it).  Only the old traces' ids are hashed: a NOT IN over every
# retained trace would cost a pass ~10x more (0.1 against 0.6-1.2 s on 6 M spans).
_OLD = "SELECT trace_id FROM spans WHERE start_ns < $cutoff"
_ALIVE = f"SELECT trace_id FROM spans WHERE start_ns >= $cutoff AND trace_id IN ({_OLD})"  # noqa: S608 - constant
# kept rows decided before the cutoff whose trace has a span at/after it
_DECIDED_ALIVE = (
    "SELECT trace_id FROM spans WHERE start_ns >= $cutoff"
    " AND trace_id IN (SELECT trace_id FROM kept_traces WHERE decided_ns < $cutoff)"
)


def _delete_sql(t: Retained, moved_only: bool = False) -> str:
    """The DELETE of `t`'s old rows; `moved_only` (a shard of a lake): only rows of the
    commits the lake holds, up to `$moved` (rows before schema 5 are commit 0)."""
    if t.table == "spans":
        where = f"start_ns < $cutoff AND trace_id NOT IN ({_ALIVE})"
    elif t.table == "kept_traces":
        # an old trace; or, with no span stored at/after the cutoff, an old decision
        where = (
            f"(trace_id IN ({_OLD}) AND trace_id NOT IN ({_ALIVE}))"
            f" OR (decided_ns < $cutoff AND trace_id NOT IN ({_DECIDED_ALIVE}))"
        )
    elif t.table == "commit_log":
        where = "committed_ns < $cutoff AND seq < (SELECT max(seq) FROM commit_log)"
    else:
        where = f"{t.column} < $cutoff"
    if moved_only:
        seq = "seq" if t.table == "commit_log" else "coalesce(commit_seq, 0)"
        return f"DELETE FROM {t.table} WHERE ({where}) AND {seq} <= $moved"  # noqa: S608 - names from TABLES
    return f"DELETE FROM {t.table} WHERE {where}"  # noqa: S608 - names from TABLES


def check_schema(conn: duckdb.DuckDBPyConnection) -> None:
    """Raises RuntimeError unless every table and time column of `TABLES` exists as a BIGINT."""
    rows = conn.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns()"
        " WHERE database_name = current_database() AND schema_name = 'main'"
    ).fetchall()
    columns = {(table, column): kind for table, column, kind in rows}
    for t in TABLES:
        if columns.get((t.table, t.column)) != "BIGINT":
            raise RuntimeError(f"retention: the store has no BIGINT column {t.table}.{t.column}")


class Retention:
    """Deletes rows older than `retention_s` on its own cursor of `conn`."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        retention_s: float,
        *,
        interval_s: float | None = None,
        clock: Callable[[], int] = time.time_ns,
        on_pass: Callable[[dict[str, int]], None] | None = None,
        moved_through: Callable[[], int | None] | None = None,
    ) -> None:
        if not retention_s > 0:
            raise ValueError(f"retention must be positive, got {retention_s}")
        check_schema(conn)
        self.retention_ns = int(retention_s * 1e9)
        self.interval_s = interval_s if interval_s is not None else min(PASS_INTERVAL_S, max(1.0, retention_s / 4))
        self._conn = conn
        self._cursor: duckdb.DuckDBPyConnection | None = None
        self._clock = clock
        self._on_pass = on_pass
        #: a shard of a lake (`lake_mover.LakeMover.moved_seq`): the newest local commit the
        #: lake holds (None: not known yet, nothing is deleted); rows after it are never deleted
        self._moved_through = moved_through
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: rows deleted so far, per table (`tokentrace_retention_deleted_total{table}`)
        self.deleted_total: dict[str, int] = {t.table: 0 for t in TABLES}
        #: when the last pass completed, unix seconds of `clock`; None before the first
        #: (`tokentrace_retention_last_run_timestamp_seconds`: a failed pass leaves it)
        self.last_pass_s: float | None = None
        self.passes = 0
        #: passes of the thread that raised (`tokentrace_retention_failed_passes_total`);
        #: a pass requested by hand (`run_pass`) raises to its caller instead
        self.failed_passes = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tokentrace-retention", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stops the thread (a pass under way finishes first) and closes the cursor."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._cursor is not None:
                self._cursor.interrupt()  # a DELETE interrupted is rolled back whole
                self._thread.join(timeout)
        with self._lock:
            if self._cursor is not None:
                self._cursor.close()
                self._cursor = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_pass()
            except Exception:  # a failed pass is retried at the next one, never ends the thread
                self.failed_passes += 1
                logger.exception("tokentrace retention: pass failed; retrying in %.0f s", self.interval_s)
            self._stop.wait(self.interval_s)

    def run_pass(self) -> dict[str, int]:
        """Deletes every row older than now − retention; gives the rows deleted per table."""
        with self._lock:
            if self._cursor is None:
                self._cursor = self._conn.cursor()
            cur = self._cursor
            cutoff = self._clock() - self.retention_ns
            t0 = time.perf_counter()
            params: dict[str, int] = {"cutoff": cutoff}
            lake = self._moved_through is not None
            if self._moved_through is not None:
                moved = self._moved_through()
                params["moved"] = -1 if moved is None else moved
            deleted: dict[str, int] = {}
            for group in _GROUPS:
                cur.execute("BEGIN TRANSACTION")
                try:
                    for t in group:
                        row = cur.execute(_delete_sql(t, lake), params).fetchone()
                        deleted[t.table] = int(row[0]) if row else 0
                    cur.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(duckdb.Error):  # the error says what went wrong
                        cur.execute("ROLLBACK")
                    raise
                for t in group:
                    self.deleted_total[t.table] += deleted[t.table]
            self.passes += 1
            self.last_pass_s = self._clock() / 1e9
        logger.info(
            "tokentrace retention: deleted %d rows older than %s in %.2f s (%s)",
            sum(deleted.values()),
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cutoff / 1e9)),
            time.perf_counter() - t0,
            ", ".join(f"{table} {n}" for table, n in deleted.items()),
        )
        if self._on_pass is not None:
            self._on_pass(deleted)
        return deleted
