"""The lake mover on a real local file (written by a real `serve` from OTLP) and a real lake
(PostgreSQL catalog): every committed row reaches the lake exactly once, whatever fails
around the lake's COMMIT, and in several moves when a move is capped."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from lake_testkit import count, differences, lake_connection, metric, post_traces, wait_until
from tt_testkit import start_serve

from tokentrace.collector.lake_mover import LakeMover
from tokentrace.collector.lake_moves import Moved
from tokentrace.store.connection import open_db

pytestmark = pytest.mark.slow


class Crash(Exception):
    """Stands for the process dying at the hook's point."""


@pytest.fixture
def local_file(tmp_path: Path) -> Path:
    """A shard's local file with request rows in several writer commits (no lake)."""
    return _written_file(tmp_path)


def _written_file(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    server = start_serve(tmp_path, "--grace-s", "0.1")
    try:
        for done in (5, 10, 15):  # three rounds: several commits
            assert post_traces(server.otlp_http, 5) == [200] * 5
            wait_until(
                lambda done=done: _requests_written(server.otlp_http) >= done, 30, "a commit"
            )
    finally:
        server.stop()
    return server.db


def _requests_written(otlp_http: str) -> float:
    return metric(otlp_http, "tokentrace_requests_written_total") or 0


def _mover(conn: duckdb.DuckDBPyConnection, lake: tuple[str, str], **kw: object) -> LakeMover:
    uri, data = lake
    return LakeMover(conn, uri, data, "s1", interval_s=1.0, max_unmoved_rows=1_000_000, **kw)  # type: ignore[arg-type]


def _assert_lake_holds_the_file_once(lake: tuple[str, str], db: Path) -> None:
    conn = lake_connection(*lake, db)
    try:
        diff = differences(conn, {"s1": 0})
        assert diff == dict.fromkeys(diff, (0, 0))
        assert count(conn, "SELECT count(*) FROM local0.requests") == 15
    finally:
        conn.close()


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_a_crash_at_the_lakes_commit_stores_each_row_once(
    local_file: Path, lake: tuple[str, str], point: str
) -> None:
    def crash(*_: object) -> None:
        raise Crash(point)

    conn = open_db(local_file)
    mover = _mover(conn, lake, **{point: crash})
    with pytest.raises(Crash):
        mover.move_now()
    conn.close()  # the crash: no close(), no last move, no bookkeeping after the hook

    conn = open_db(local_file)  # the restart
    again = _mover(conn, lake)
    moved = again.move_now()
    if point == "after_commit":
        assert moved is None  # the lake's ledger says the batch is in
    else:
        assert moved is not None and moved.left == 0
    assert again.move_now() is None
    again.close()
    conn.close()
    _assert_lake_holds_the_file_once(lake, local_file)


def test_a_capped_move_catches_up_in_several_moves(local_file: Path, lake: tuple[str, str]) -> None:
    conn = open_db(local_file)
    moves: list[Moved] = []
    mover = _mover(conn, lake, move_rows=1, after_commit=moves.append)
    while mover.move_now() is not None:
        pass
    mover.close()
    conn.close()
    assert len(moves) >= 3  # one commit a move at most, past the first
    assert [m.first_seq for m in moves[1:]] == [m.last_seq + 1 for m in moves[:-1]]
    assert moves[-1].left == 0 and sum(m.rows for m in moves) == mover.rows_moved_total
    _assert_lake_holds_the_file_once(lake, local_file)


def test_a_new_file_under_an_old_shard_name_moves_from_its_own_first_commit(
    local_file: Path, lake: tuple[str, str], tmp_path: Path
) -> None:
    """A shard whose disk was replaced (or a name given to two processes): its commits number
    from 1 again, and a position kept per name would skip them as moved."""
    replaced = _written_file(tmp_path / "new-disk")
    for db in (local_file, replaced):
        conn = open_db(db)
        mover = _mover(conn, lake)
        while mover.move_now() is not None:
            pass
        mover.close()
        conn.close()
    conn = lake_connection(*lake, local_file, replaced)
    try:
        diff = differences(conn, {"s1": 0, "s1 again": 1})
        assert diff == dict.fromkeys(diff, (0, 0))
        assert count(conn, "SELECT count(*) FROM lake.requests") == 30
        assert count(conn, "SELECT count(DISTINCT store_id) FROM lake.lake_moves WHERE shard = 's1'") == 2
    finally:
        conn.close()
