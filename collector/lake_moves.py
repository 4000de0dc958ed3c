"""One move of a shard's sealed rows into the lake: the SQL of it, on one cursor.

A move is ONE lake transaction: every `DATA_TABLES` table's rows of the local commits
`after+1 .. upto` (their `commit_seq`; NULL, written before schema 5, counts as 0) are copied
with `INSERT INTO lake.t SELECT ... FROM main.t`, and the ledger row `lake.lake_moves(shard,
first_seq, last_seq, rows, moved_ns)` goes in with them.  DuckDB lets a transaction read
one attached database while it writes another (it writes one database per transaction), so the
local rows are read in the very snapshot the move commits from.  Where the shard's moves
start is read from the ledger, in the same transaction: the lake is the truth, not local
bookkeeping, so a batch whose move committed is never moved again, whatever crashed after
the lake's COMMIT (tests/lake/test_lake_mover.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from tokentrace.store.lake.catalog import ALIAS, local_columns
from tokentrace.store.schema import DATA_TABLES

#: Rows one move takes at most: a shard that is behind (the lake was down) catches up in
#: several moves, each a transaction of bounded size and memory.
MAX_MOVE_ROWS = 200_000


@dataclass(frozen=True, slots=True)
class Moved:
    """What one move committed: the local commits `first_seq`..`last_seq` and their rows."""

    first_seq: int
    last_seq: int
    rows: int
    #: rows left unmoved after it (committed locally by the time the move read them)
    left: int


#: This local file's name in the ledger (schema 5's `store_identity`).
_STORE_ID = "(SELECT store_id FROM main.store_identity)"


def moved_through(cur: duckdb.DuckDBPyConnection, shard: str) -> int:
    """Gives the newest local commit the lake holds of `shard`'s local file (-1: none yet).
    Per file, not per name: a shard whose disk was replaced (its seqs start again at 1), or a
    name given to two processes by mistake, never skips commits another file's seqs passed."""
    sql = (
        f"SELECT coalesce(max(last_seq), -1) FROM {ALIAS}.lake_moves"  # noqa: S608 - fixed alias
        f" WHERE shard = ? AND store_id = {_STORE_ID}"
    )
    [(seq,)] = cur.execute(sql, [shard]).fetchall()
    return int(seq)


def _after(after: int) -> str:
    # rows written before schema 5 have no commit_seq: they belong to commit 0; later moves
    # filter on the bare column, which DuckDB prunes by its row groups' min/max
    return "coalesce(commit_seq, 0) > $after" if after < 0 else "commit_seq > $after"


def unmoved_commits(cur: duckdb.DuckDBPyConnection, after: int) -> list[tuple[int, int]]:
    """Gives (commit_seq, rows) of every local commit after `after` with data rows, oldest first."""
    per_table = " UNION ALL ".join(
        f"SELECT coalesce(commit_seq, 0) AS seq FROM main.{table} WHERE {_after(after)}"  # noqa: S608 - names from the schema
        for table in DATA_TABLES
    )
    sql = f"SELECT seq, count(*) FROM ({per_table}) GROUP BY seq ORDER BY seq"  # noqa: S608
    return [(int(s), int(n)) for s, n in cur.execute(sql, {"after": after}).fetchall()]


def unmoved_rows(cur: duckdb.DuckDBPyConnection, after: int) -> int:
    """Gives how many local rows are in commits after `after` (the lake does not hold them)."""
    return sum(n for _, n in unmoved_commits(cur, after))


def choose_upto(commits: list[tuple[int, int]], newest: int, cap: int) -> tuple[int, int]:
    """Gives (upto, rows): the last commit of the next move and its rows; the oldest commits
    whose rows stay within `cap` (one commit at least), all of them up to `newest`."""
    rows = 0
    for i, (_seq, n) in enumerate(commits):
        if i and rows + n > cap:
            return commits[i - 1][0], rows
        rows += n
    return max(newest, commits[-1][0]) if commits else newest, rows


def _insert_sql(table: str, after: int) -> str:
    names = ", ".join(f'"{column}"' for column, _ in local_columns()[table])
    return (
        f"INSERT INTO {ALIAS}.{table} ({names}) SELECT {names} FROM main.{table}"  # noqa: S608 - names from the schema
        f" WHERE {_after(after)} AND coalesce(commit_seq, 0) <= $upto"
    )


def move_once(
    cur: duckdb.DuckDBPyConnection,
    shard: str,
    *,
    cap: int = MAX_MOVE_ROWS,
    clock: Callable[[], int] = time.time_ns,
    before_commit: Callable[[], None] | None = None,
) -> Moved | None:
    """Moves the oldest unmoved commits (up to `cap` rows) in one lake transaction on `cur`
    (a cursor of the write connection, the lake attached); gives what it moved, None when
    the lake holds every committed row.  Raises DuckDB's error, the transaction rolled back."""
    cur.execute("BEGIN TRANSACTION")
    try:
        after = moved_through(cur, shard)
        commits = unmoved_commits(cur, after)
        if not commits:
            cur.execute("ROLLBACK")
            return None
        [(newest,)] = cur.execute("SELECT coalesce(max(seq), 0) FROM main.commit_log").fetchall()
        upto, rows = choose_upto(commits, int(newest), cap)
        params = {"after": after, "upto": upto}
        for table in DATA_TABLES:
            cur.execute(_insert_sql(table, after), params)
        cur.execute(
            f"INSERT INTO {ALIAS}.lake_moves VALUES (?, ?, ?, ?, ?, {_STORE_ID})",  # noqa: S608 - fixed alias
            [shard, after + 1, upto, rows, clock()],
        )
        if before_commit is not None:
            before_commit()
        cur.execute("COMMIT")
    except BaseException:
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            pass  # DuckDB ended the transaction itself: the original error says why
        raise
    left = sum(n for seq, n in commits if seq > upto)
    return Moved(after + 1, upto, rows, left)
