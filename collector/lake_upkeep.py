"""Keeping the lake's files few and its data directory bounded: inlining, compaction, expiry.

DuckLake writes one Parquet file per partition per table per move: a move of every table
writes up to 6 tables x 16 trace-id buckets + 2 = 98 files.  Measured here (PostgreSQL 15
catalog, local disk, 3 tables a move): 48 files and 126 ms a move of 50 rows a table, 48
files and 372 ms at 50,000 rows a table.  At the default 2 s interval that would be ~50
files a second per shard, most of them a few rows.  What is done, and why:

- **Data inlining** (`data_inlining_row_limit`, `INLINE_ROWS`): a table's insert of fewer rows
  is kept in the catalog's own tables, not in a file.  A quiet shard's move then writes no
  file at all (measured: 0 files and 44 ms a move of 50 rows a table, against 48 files and
  126 ms without); a busy shard's moves are big enough for files worth writing.
- **Upkeep, every `UPKEEP_INTERVAL_S`**: `ducklake_flush_inlined_data` writes the inlined rows
  out in one file per partition, `ducklake_merge_adjacent_files` merges the small files of a
  partition (measured: 567 files of 12 moves became 48, one per partition, in 1.3 s), then
  `ducklake_expire_snapshots` and `ducklake_cleanup_old_files` delete what no snapshot newer
  than `KEEP_SNAPSHOTS_S` reads: a reader's query that started before the merge still finds
  its files for that long.  Every shard runs it; two shards' upkeep may conflict: the loser
  skips and tries at its next turn (compaction is never urgent).
"""

from __future__ import annotations

import logging

import duckdb

from tokentrace.store.lake.catalog import ALIAS, is_conflict

logger = logging.getLogger("tokentrace.collector")

#: Inserts of fewer rows than this, per table, are kept in the catalog until the next upkeep.
INLINE_ROWS = 1000
#: Seconds between upkeeps (flush, merge, expire, clean) of one shard.
UPKEEP_INTERVAL_S = 300.0
#: Snapshots (and the files only they read) live this long after a newer one replaced them:
#: the safety delay of a reader's query running over an older snapshot.
KEEP_SNAPSHOTS_S = 3600

_STEPS: tuple[tuple[str, str], ...] = (
    ("flush", f"CALL ducklake_flush_inlined_data('{ALIAS}')"),
    ("merge", f"CALL ducklake_merge_adjacent_files('{ALIAS}')"),
    (
        "expire",
        f"CALL ducklake_expire_snapshots('{ALIAS}', older_than => now() - to_seconds($keep))",
    ),
    (
        "clean",
        f"CALL ducklake_cleanup_old_files('{ALIAS}', older_than => now() - to_seconds($keep))",
    ),
)


def set_inlining(cur: duckdb.DuckDBPyConnection, rows: int = INLINE_ROWS) -> None:
    """Sets the lake's data inlining limit (a catalog option: the same value from every shard)."""
    cur.execute(f"CALL {ALIAS}.set_option('data_inlining_row_limit', {int(rows)})")


def run_upkeep(cur: duckdb.DuckDBPyConnection, keep_s: int = KEEP_SNAPSHOTS_S) -> list[str]:
    """Flushes inlined rows, merges small files, expires old snapshots and deletes the files
    nothing reads; gives the steps skipped because another writer's commit won the race.
    Raises any other DuckDB error (the lake unreachable)."""
    skipped = []
    for name, sql in _STEPS:
        try:
            cur.execute(sql, {"keep": keep_s} if "$keep" in sql else None).fetchall()
        except duckdb.Error as exc:
            if not is_conflict(exc):
                raise
            skipped.append(name)
            logger.info(
                "tokentrace lake: upkeep step %s lost a race with another writer; next turn", name
            )
    return skipped
