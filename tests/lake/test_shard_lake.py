"""Shards (`tokentrace serve --lake`, real processes) moving into one lake over a real
PostgreSQL: every row once, from two shards; the lake down, then up; the unmoved-rows bound
(503); a shard killed with -9 and restarted."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from lake_testkit import (
    count,
    differences,
    get,
    lake_connection,
    metric,
    post_traces,
    readyz,
    wait_until,
)
from tt_postgres import PostgresServer, bin_dir
from tt_testkit import start_serve

pytestmark = pytest.mark.slow

MOVE = ("--lake-move-interval-s", "0.3", "--grace-s", "0.1")


def _shard(tmp_path: Path, lake: tuple[str, str], name: str, *extra: str):  # type: ignore[no-untyped-def]
    uri, data = lake
    (tmp_path / name).mkdir(exist_ok=True)
    return start_serve(
        tmp_path / name, "--lake", uri, "--lake-data", data, "--shard", name, *MOVE, *extra
    )


def _moved(otlp_http: str, rows: int) -> bool:
    return (metric(otlp_http, "tokentrace_lake_rows_moved_total") or 0) >= rows and (
        metric(otlp_http, "tokentrace_lake_unmoved_rows") == 0
    )


def test_two_shards_move_every_row_of_every_table_once(
    tmp_path: Path, lake: tuple[str, str]
) -> None:
    a, b = _shard(tmp_path, lake, "a"), _shard(tmp_path, lake, "b")
    try:
        assert post_traces(a.otlp_http, 12) == [200] * 12
        assert post_traces(b.otlp_http, 8) == [200] * 8
        for shard in (a, b):
            wait_until(lambda s=shard: _moved(s.otlp_http, 1), 60, "the moves")
            assert metric(shard.otlp_http, "tokentrace_lake_reachable") == 1
    finally:
        a.stop()
        b.stop()
    conn = lake_connection(*lake, a.db, b.db)
    try:
        diff = differences(conn, {"a": 0, "b": 1})
        assert diff == dict.fromkeys(diff, (0, 0))
        assert count(conn, "SELECT count(*) FROM lake.requests") == 20
        assert {
            s for (s,) in conn.execute("SELECT DISTINCT shard FROM lake.lake_moves").fetchall()
        } == {"a", "b"}
    finally:
        conn.close()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test alone: it is stopped and started again."""
    if bin_dir() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


def test_the_lake_down_the_shard_takes_exports_then_refuses_past_its_bound_then_catches_up(
    tmp_path: Path, own_postgres: PostgresServer
) -> None:
    lake = own_postgres.new_lake(tmp_path / "lake-data")
    # 3 request traces are 3 requests + 3 itl rows + 18 spans + 3 kept rows: 27 rows
    shard = _shard(tmp_path, lake, "a", "--lake-max-unmoved-rows", "40")
    try:
        assert post_traces(shard.otlp_http, 1) == [200]
        wait_until(lambda: _moved(shard.otlp_http, 1), 60, "the first move")
        own_postgres.pause()
        assert post_traces(shard.otlp_http, 3) == [200] * 3  # within the bound: taken
        wait_until(
            lambda: metric(shard.otlp_http, "tokentrace_lake_reachable") == 0, 60, "unreachable"
        )
        status, body = readyz(shard.otlp_http)
        assert status == 200 and "lake unreachable" in body["lake"], body
        assert (metric(shard.otlp_http, "tokentrace_lake_moves_failed_total") or 0) >= 1
        wait_until(lambda: post_traces(shard.otlp_http, 1) == [503], 60, "the bound's 503")
        status, body, headers = get(shard.otlp_http + "/readyz")
        assert status == 503 and "of lake_max_unmoved_rows 40" in body
        assert {k.lower() for k in headers} >= {"retry-after"}
        unmoved = metric(shard.otlp_http, "tokentrace_lake_unmoved_rows")
        assert unmoved is not None and unmoved > 40
        own_postgres.start()
        wait_until(lambda: _moved(shard.otlp_http, 1), 90, "the catch-up")
        assert metric(shard.otlp_http, "tokentrace_lake_reachable") == 1
        assert readyz(shard.otlp_http) == (200, {"status": "ready"})
        assert post_traces(shard.otlp_http, 1) == [200]
        wait_until(lambda: _moved(shard.otlp_http, 1), 60, "the last move")
    finally:
        shard.stop()
    conn = lake_connection(*lake, shard.db)
    try:
        diff = differences(conn, {"a": 0})
        assert diff == dict.fromkeys(diff, (0, 0))
    finally:
        conn.close()


def test_a_shard_killed_and_restarted_moves_every_committed_row_once(
    tmp_path: Path, lake: tuple[str, str]
) -> None:
    # moves far apart: the kill finds committed rows not yet moved
    shard = _shard(tmp_path, lake, "a", "--lake-move-interval-s", "3600")
    assert post_traces(shard.otlp_http, 10) == [200] * 10
    wait_until(
        lambda: (metric(shard.otlp_http, "tokentrace_requests_written_total") or 0) >= 10,
        30,
        "writes",
    )
    shard.proc.send_signal(signal.SIGKILL)
    shard.proc.wait(30)
    shard.stop()
    again = _shard(tmp_path, lake, "a")
    try:
        wait_until(lambda: _moved(again.otlp_http, 1), 60, "the move after the restart")
    finally:
        again.stop()
    conn = lake_connection(*lake, again.db)
    try:
        diff = differences(conn, {"a": 0})
        assert diff == dict.fromkeys(diff, (0, 0))
        assert count(conn, "SELECT count(*) FROM lake.requests") >= 10
    finally:
        conn.close()
